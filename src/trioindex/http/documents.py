"""Documents over HTTP: upload one (``POST /v1/documents/{key}``), delete one, list them with
each model's state, and show one with every version.

An upload is what ``ingest`` does for one file: the body is spooled and hashed
(:mod:`trioindex.http.upload`), stored under its content address, then enqueued together with
the other uploads stored meanwhile (:mod:`trioindex.http.enqueuer`: one
``trioindex_enqueue_documents`` call and one commit for the group). The answer is sent
once the upload's row is committed. The same bytes twice are one version (``unchanged``;
``repaired`` when that version had lost its blob).
"""

from __future__ import annotations

import functools
from typing import Any, Final

import attrs
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from trioindex.db.enqueue import latest_version, requeue_failed_job
from trioindex.db.operations.document_views import (
    DocumentView,
    VersionView,
    list_documents,
    show_document,
)
from trioindex.http.context import Service, service
from trioindex.http.enqueuer import Body, StoredBody, Upload, store_body
from trioindex.http.errors import ApiError
from trioindex.http.limits import bool_param, check_text, int_param, priority_param
from trioindex.http.metrics import UPLOADED
from trioindex.http.upload import spooled_body
from trioindex.ingest.files import prepare_bytes
from trioindex.ingest.results import IngestResult
from trioindex.values import as_json

#: Content types that say nothing about the document (clients send them by default): the
#: type is then guessed from the key's name, as ingest guesses it from the file's.
UNDECLARED_TYPES: Final = frozenset(
    {"", "application/octet-stream", "application/x-www-form-urlencoded"}
)
MAX_PAGE: Final = 1000


def document_key(request: Request) -> str:
    return check_text("the document key", request.path_params["key"])


def _declared_type(request: Request) -> str | None:
    declared = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return None if declared in UNDECLARED_TYPES else check_text("Content-Type", declared, 255)


async def upload(request: Request) -> Response:
    svc = service(request)
    key = document_key(request)
    params = request.query_params
    name = check_text("name", params.get("name") or key.rsplit("/", 1)[-1])
    priority = priority_param(params.get("priority"))
    content_type = _declared_type(request)
    async with spooled_body(request, limit=svc.settings.parsing.max_document_bytes) as spooled:
        UPLOADED.inc(spooled.size)
        body = Body(key, name, spooled.sha256, spooled.size, content_type, spooled.file)
        stored = await svc.services.storage.run(functools.partial(store_body, body=body))
        result = await svc.uploads.submit(Upload(stored, priority))
        if result.status == "unchanged":
            result = await _repaired(svc, result, stored, body)
    payload = result.as_json()
    del payload["path"]
    payload.update(sha256=spooled.sha256, byte_size=spooled.size)
    return JSONResponse(payload, status_code=201 if result.status == "created" else 200)


async def _repaired(
    svc: Service, result: IngestResult, stored: StoredBody, body: Body
) -> IngestResult:
    """An ``unchanged`` upload, ``repaired`` if its version had lost its blob (the rule of
    ``ingest``): the blob is whole again and the version's FAILED job goes back to the queue.
    A version at the content address was restored when the upload was stored; one registered in
    place from a bucket has its own object, checked (and restored) here."""
    db = svc.services.db
    latest = await db.run(latest_version, result.document_key)
    if latest is None or latest["version_id"] != result.version_id:
        return result  # another upload made a newer version meanwhile
    if latest["storage_key"] == stored.version.storage_key:
        lost = not stored.was_intact
    else:
        body.handle.seek(0)
        prepared = await svc.services.storage.run(
            functools.partial(
                prepare_bytes,
                handle=body.handle,
                document_key=body.document_key,
                original_name=body.original_name,
                sha256=body.sha256,
                size=body.size,
                latest=latest,
                content_type=stored.version.content_type,
            )
        )
        lost = prepared.restored
    if not lost:
        return result
    return await mark_repaired(svc, result)


async def mark_repaired(svc: Service, result: IngestResult) -> IngestResult:
    """``result``, whose version's blob was whole again, as ``repaired``: the version's FAILED
    job (if any) back in the queue."""
    requeued = result.job_id is not None and await svc.services.db.run(
        requeue_failed_job, result.job_id, extra_attempts=svc.settings.worker.max_attempts
    )
    return attrs.evolve(result, status="repaired", requeued=requeued)


async def delete(request: Request) -> Response:
    key = document_key(request)
    report = await service(request).index.delete([key])
    if report.missing:
        raise ApiError(404, "not_found", f"no document with key {key!r}")
    return JSONResponse({"deleted": key, "blobs_removed": report.blobs_removed})


def _version(version: VersionView) -> Any:
    return as_json(version)


def _document(document: DocumentView, *, every_version: bool) -> dict[str, Any]:
    shown: dict[str, Any] = {
        "key": document.key,
        "id": str(document.id),
        "created_at": document.created_at.isoformat(),
        "version_count": document.version_count,
    }
    if every_version:
        shown["versions"] = [_version(v) for v in document.versions]
    else:
        shown["latest"] = _version(document.versions[-1])
    return shown


async def list_all(request: Request) -> Response:
    params = request.query_params
    prefix = params.get("prefix") or ""
    if prefix:
        check_text("prefix", prefix)
    after = params.get("after")
    if after is not None:
        check_text("after", after)
    limit = int_param(params.get("limit"), "limit", default=100, low=1, high=MAX_PAGE)
    flagged = params.get("low_confidence")
    low_confidence = None if flagged is None else bool_param(flagged, "low_confidence")
    page = await service(request).services.db.run(
        list_documents, prefix=prefix, after=after, limit=limit, low_confidence=low_confidence
    )
    return JSONResponse(
        {
            "documents": [_document(d, every_version=False) for d in page.documents],
            "next_after": page.next_after,
        }
    )


async def show(request: Request) -> Response:
    document = await service(request).services.db.run(show_document, document_key(request))
    return JSONResponse(_document(document, every_version=True))
