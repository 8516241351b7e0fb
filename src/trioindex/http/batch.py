"""Many documents in one request: ``POST /v1/documents`` with a ``multipart/form-data`` body,
each part one document, as ``ingest`` takes many files.

A part's field name (``name=`` of its ``Content-Disposition``) is its document key; its
``filename`` its original name (the last segment after ``/`` or ``\\``; the key's last segment
when the part has none); its ``Content-Type`` kept unless generic (then guessed from the name,
as for one upload). ``?priority=`` is the jobs' priority for the whole batch.

The body is parsed as it arrives (python-multipart's streaming parser) and each part spooled
and hashed as one upload is (:class:`trioindex.http.upload.Spool`: in memory below 1 MiB, else
a temporary file). Small parts are stored together: once :data:`STORE_BYTES` or
:data:`STORE_PARTS` of them are waiting (and at the end), one query reads their documents'
newest versions and up to 8 store threads at once store them, each its slice in one
``deferred_sync`` block (as ``ingest`` stores a group), by ``ingest``'s rule
(:func:`trioindex.ingest.files.prepare_bytes`: the bytes of the newest version are not stored
again, a lost blob is restored); a part spooled to a file is stored at once. Memory holds at
most :data:`STORE_BYTES` of small parts and one 1 MiB piece.

Once the body has ended, every stored part goes to the service's upload enqueuer (one
transaction for what gathered, the single upload's path) and the answer lists one result per
part in order: ``created``, ``unchanged``, ``repaired`` or ``refused`` with its own code. A
part is refused alone when its key or name is not storable text of 1 to 1,024 characters
(``invalid_key``, ``invalid_name``; an empty ``filename`` is refused, a missing one is not),
its ``Content-Type`` is not (``invalid_content_type``), it is over the document size
(``document_too_large``), an earlier part of the batch has its key (``duplicate_key``), or the
database refuses its row. The whole request is refused, and nothing of it enqueued, when the
body is not multipart, breaks its framing, ends early, has more than :data:`MAX_PARTS` parts
or more than :data:`BATCH_DOCUMENTS` times the document size in all.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Final

import attrs
import trio
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from trioindex.db.enqueue import latest_versions
from trioindex.http.context import Service, service
from trioindex.http.documents import UNDECLARED_TYPES, mark_repaired
from trioindex.http.enqueuer import Body, StoredBody, Upload, prepare_body
from trioindex.http.errors import ApiError, classify, invalid
from trioindex.http.limits import (
    MAX_KEY_CHARS,
    check_text,
    declared_length,
    priority_param,
    too_large,
)
from trioindex.http.metrics import UPLOADED
from trioindex.http.upload import Spool
from trioindex.ingest import FILES_AT_ONCE
from trioindex.ingest.files import PreparedFile
from trioindex.ingest.results import IngestResult
from trioindex.storage import ObjectStore

#: Parts (documents) in one batch at most.
MAX_PARTS: Final = 1000
#: A batch's body is at most this many times ``indexing.parsing.max-document-size``.
BATCH_DOCUMENTS: Final = 4
#: One header line of a part at most (a longer one breaks the request's framing).
MAX_HEADER_BYTES: Final = 16 << 10
#: Small parts waiting to be stored together at most (their bytes, their count).
STORE_BYTES: Final = 4 << 20
STORE_PARTS: Final = 64
_STATUSES: Final = ("created", "unchanged", "repaired", "refused")


class PartRefused(Exception):
    """One part refused, with its stable code and a message that never quotes its value."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@attrs.define
class _Part:
    """The part being read: its headers as they arrive, then what they say."""

    index: int
    header_lines: list[tuple[bytes, bytes]] = attrs.field(factory=list)
    field: bytearray = attrs.field(factory=bytearray)
    value: bytearray = attrs.field(factory=bytearray)
    key: str | None = None
    name: str = ""
    content_type: str | None = None
    spool: Spool | None = None
    refused: PartRefused | None = None


@attrs.frozen
class _Stored:
    """A part in the store, ready to enqueue."""

    index: int
    prepared: PreparedFile

    @property
    def key(self) -> str:
        return self.prepared.version.document_key


def _text(raw: bytes, what: str, code: str, max_chars: int = MAX_KEY_CHARS) -> str:
    try:
        value = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PartRefused(code, f"{what} must be UTF-8 text") from None
    try:
        return check_text(what, value, max_chars)
    except ApiError as exc:
        raise PartRefused(code, exc.message) from None


def part_meta(headers: Sequence[tuple[bytes, bytes]]) -> tuple[str, str | None, str | None]:
    """The document key, original name (None: the key's last segment) and declared content
    type (None: guessed) of a part with these headers; :class:`PartRefused` otherwise."""
    found = {name.strip().lower(): value for name, value in headers}
    disposition, options = parse_options_header(found.get(b"content-disposition", b""))
    if disposition != b"form-data" or b"name" not in options:
        raise PartRefused(
            "invalid_key", 'the part has no Content-Disposition: form-data; name="KEY"'
        )
    key = _text(options[b"name"], "the part's name (its document key)", "invalid_key")
    name: str | None = None
    if b"filename" in options:
        raw = options[b"filename"].replace(b"\\", b"/").rsplit(b"/", 1)[-1]
        name = _text(raw, "the part's filename", "invalid_name")
        if name in {".", ".."}:
            raise PartRefused("invalid_name", "the part's filename must name a file")
    declared = found.get(b"content-type", b"").split(b";")[0].strip().lower()
    content_type = None
    if declared.decode("latin-1") not in UNDECLARED_TYPES:
        content_type = _text(declared, "the part's Content-Type", "invalid_content_type", 255)
    return key, name, content_type


def _store_all(
    bodies: Sequence[Body], store: ObjectStore, latest: dict[str, Any]
) -> list[PreparedFile]:
    """Store ``bodies`` by ``ingest``'s rule in one thread; durable before this returns."""
    with store.deferred_sync():
        return [prepare_body(store, body, latest=latest.get(body.document_key)) for body in bodies]


class BatchReader:
    """One batch request's parts: parsed, spooled, stored; then enqueued (:meth:`enqueue`)."""

    def __init__(self, svc: Service, boundary: bytes) -> None:
        self.svc = svc
        self.limit = svc.settings.parsing.max_document_bytes
        self.refused: dict[int, tuple[str | None, PartRefused]] = {}
        self.stored: list[_Stored] = []
        self.keys: set[str] = set()
        self.ended = False
        self._events: list[tuple[str, bytes]] = []
        self._part: _Part | None = None
        self._waiting: list[tuple[int, Body]] = []
        self._waiting_bytes = 0
        self._count = 0
        events = self._events

        def mark(name: str) -> Any:
            return lambda: events.append((name, b""))

        def data(name: str) -> Any:
            return lambda buffer, start, end: events.append((name, bytes(buffer[start:end])))

        self._parser = MultipartParser(
            boundary,
            {
                "on_part_begin": mark("begin"),
                "on_header_field": data("field"),
                "on_header_value": data("value"),
                "on_header_end": mark("header_end"),
                "on_headers_finished": mark("headers"),
                "on_part_data": data("data"),
                "on_part_end": mark("part_end"),
                "on_end": mark("end"),
            },
            max_header_size=MAX_HEADER_BYTES,
        )

    async def read(self, request: Request) -> None:
        """Parse, spool and store the whole body; raises for what refuses the request."""
        batch_limit = self.limit * BATCH_DOCUMENTS
        declared_length(request, batch_limit, "body_too_large")
        size = 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > batch_limit:
                    raise too_large("body_too_large", batch_limit)
                try:
                    self._parser.write(chunk)
                except MultipartParseError:
                    raise invalid("the multipart/form-data body is malformed") from None
                await self._handle_events()
            if not self.ended:
                raise invalid("the multipart/form-data body ended before its closing boundary")
            await self._store_waiting()
        finally:
            await self._discard()

    async def _handle_events(self) -> None:
        events = self._events[:]
        self._events.clear()
        for kind, data in events:
            if kind == "begin":
                self._begin()
            elif kind == "end":
                self.ended = True
            else:
                part = self._part
                assert part is not None
                await self._in_part(part, kind, data)

    def _begin(self) -> None:
        if self._count >= MAX_PARTS:
            raise ApiError(413, "too_many_parts", f"a batch holds at most {MAX_PARTS} parts")
        self._part = _Part(self._count)
        self._count += 1

    async def _in_part(self, part: _Part, kind: str, data: bytes) -> None:
        if kind == "field":
            part.field += data
        elif kind == "value":
            part.value += data
        elif kind == "header_end":
            part.header_lines.append((bytes(part.field), bytes(part.value)))
            part.field.clear()
            part.value.clear()
        elif kind == "headers":
            self._headers_done(part)
        elif part.refused is not None:
            pass  # a refused part's bytes are read and dropped
        elif kind == "data":
            assert part.spool is not None
            try:
                await part.spool.add(data)
            except ApiError as exc:
                await self._refuse(part, PartRefused(exc.code, exc.message))
        elif kind == "part_end":
            await self._part_done(part)

    def _headers_done(self, part: _Part) -> None:
        try:
            key, name, content_type = part_meta(part.header_lines)
            part.key = key
            if key in self.keys:
                raise PartRefused("duplicate_key", "an earlier part of this batch has this key")
            self.keys.add(key)
        except PartRefused as exc:
            part.refused = exc
            self.refused[part.index] = (part.key, exc)
            return
        part.name = name or key.rsplit("/", 1)[-1]
        part.content_type = content_type
        part.spool = Spool(self.limit)

    async def _refuse(self, part: _Part, refusal: PartRefused) -> None:
        part.refused = refusal
        self.refused[part.index] = (part.key, refusal)
        if part.spool is not None:
            await part.spool.aclose()
            part.spool = None

    async def _part_done(self, part: _Part) -> None:
        assert part.spool is not None and part.key is not None
        spooled = await part.spool.finish()
        UPLOADED.inc(spooled.size)
        body = Body(
            part.key, part.name, spooled.sha256, spooled.size, part.content_type, spooled.file
        )
        self._waiting.append((part.index, body))
        if spooled.in_memory:
            part.spool = None
            self._waiting_bytes += spooled.size
            if self._waiting_bytes >= STORE_BYTES or len(self._waiting) >= STORE_PARTS:
                await self._store_waiting()
        else:
            try:
                await self._store_waiting()  # its file is read now, then removed
            finally:
                await part.spool.aclose()
                part.spool = None

    async def _store_waiting(self) -> None:
        """Store the waiting parts: one query for their documents' newest versions, then
        :data:`FILES_AT_ONCE` slices in store threads at once (as ``ingest`` stores a group:
        S3 keeps several uploads in flight, a folder store waits for its fsyncs once per
        slice); the first outage cancels the other slices and is raised."""
        waiting, self._waiting, self._waiting_bytes = self._waiting, [], 0
        if not waiting:
            return
        bodies = [body for _, body in waiting]
        services = self.svc.services
        latest = await services.db.run(latest_versions, [b.document_key for b in bodies])
        prepared = await services.storage.run_slices(
            bodies, functools.partial(_store_all, latest=latest), slices=FILES_AT_ONCE
        )
        self.stored += (
            _Stored(index, ready)
            for (index, _), ready in zip(
                waiting, (p for part in prepared for p in part), strict=True
            )
        )

    async def _discard(self) -> None:
        if self._part is not None and self._part.spool is not None:
            await self._part.spool.aclose()

    async def enqueue(self, priority: int) -> dict[int, IngestResult | PartRefused]:
        """Every stored part through the service's upload enqueuer; a part the database
        refuses is refused alone, an outage (a 5xx) is raised once every part has its turn."""
        results: dict[int, IngestResult | PartRefused] = {}
        outages: list[Exception] = []

        async def one(part: _Stored) -> None:
            stored = StoredBody(part.prepared.version, was_intact=not part.prepared.restored)
            try:
                result = await self.svc.uploads.submit(Upload(stored, priority))
                if result.status == "unchanged" and part.prepared.restored:
                    result = await mark_repaired(self.svc, result)
            except Exception as exc:
                error = classify(exc)
                if error is None or error.status >= 500:
                    outages.append(exc)
                    return
                results[part.index] = PartRefused(error.code, error.message)
                return
            results[part.index] = result

        async with trio.open_nursery() as nursery:
            for part in self.stored:
                nursery.start_soon(one, part)
        if outages:
            raise outages[0]
        return results


def _boundary(request: Request) -> bytes:
    kind, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary", b"")
    if kind != b"multipart/form-data" or not boundary:
        raise ApiError(
            415,
            "unsupported_media_type",
            "a batch upload is multipart/form-data with a boundary (one part per document)",
        )
    return boundary


async def upload_batch(request: Request) -> Response:
    """``POST /v1/documents``: every part of the body a document; one result per part."""
    svc = service(request)
    priority = priority_param(request.query_params.get("priority"))
    reader = BatchReader(svc, _boundary(request))
    await reader.read(request)
    results: dict[int, IngestResult | PartRefused] = await reader.enqueue(priority)
    stored = {part.index: part for part in reader.stored}
    shown: list[dict[str, Any]] = []
    for index in sorted([*results, *reader.refused]):
        if index in reader.refused:
            key, refusal = reader.refused[index]
            shown.append(_refusal(index, key, refusal))
            continue
        result = results[index]
        if isinstance(result, PartRefused):
            shown.append(_refusal(index, stored[index].key, result))
            continue
        payload = result.as_json()
        del payload["path"]
        version = stored[index].prepared.version
        shown.append(
            {"part": index, **payload, "sha256": version.sha256, "byte_size": version.byte_size}
        )
    counts = {status: sum(1 for s in shown if s["status"] == status) for status in _STATUSES}
    return JSONResponse({"documents": shown, **counts})


def _refusal(index: int, key: str | None, refusal: PartRefused) -> dict[str, Any]:
    return {
        "part": index,
        "document_key": key,
        "status": "refused",
        "error": {"code": refusal.code, "message": refusal.message},
    }
