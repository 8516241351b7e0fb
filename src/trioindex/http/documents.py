"""Documents over HTTP: upload one (``POST /v1/documents/{key}``), delete one, list them with
each model's state, and show one with every version.

An upload is what ``ingest`` does for one file: the body is spooled and hashed
(:mod:`trioindex.http.upload`), stored under its content address unless the document's newest
version has the same bytes (:func:`trioindex.ingest.files.prepare_bytes`), then enqueued
(:func:`trioindex.ingest.files.enqueue_files`, i.e. ``trioindex_enqueue_documents``). The same
bytes twice are one version (``unchanged``).
"""

from __future__ import annotations

import functools
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from trioindex.db.operations import DocumentView, VersionView, list_documents, show_document
from trioindex.http.context import service
from trioindex.http.errors import ApiError
from trioindex.http.limits import bool_param, check_text, int_param, priority_param
from trioindex.http.metrics import UPLOADED
from trioindex.http.upload import spooled_body
from trioindex.ingest import latest_version
from trioindex.ingest.files import enqueue_files, prepare_bytes
from trioindex.values import as_json

#: Content types that say nothing about the document (clients send them by default): the
#: type is then guessed from the key's name, as ingest guesses it from the file's.
_UNDECLARED: Final = frozenset(
    {"", "application/octet-stream", "application/x-www-form-urlencoded"}
)
MAX_PAGE: Final = 1000


def document_key(request: Request) -> str:
    return check_text("the document key", request.path_params["key"])


def _declared_type(request: Request) -> str | None:
    declared = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return None if declared in _UNDECLARED else check_text("Content-Type", declared, 255)


async def upload(request: Request) -> Response:
    svc = service(request)
    key = document_key(request)
    params = request.query_params
    name = check_text("name", params.get("name") or key.rsplit("/", 1)[-1])
    priority = priority_param(params.get("priority"))
    content_type = _declared_type(request)
    db, store = svc.services.db, svc.services.storage
    async with spooled_body(request, limit=svc.settings.parsing.max_document_bytes) as body:
        UPLOADED.inc(body.size)
        latest = await db.run(latest_version, key)
        prepared = await store.run(
            functools.partial(
                prepare_bytes,
                handle=body.file,
                document_key=key,
                original_name=name,
                sha256=body.sha256,
                size=body.size,
                latest=latest,
                content_type=content_type,
            )
        )
    (result,) = await enqueue_files(
        [prepared],
        db=db,
        model_id=svc.services.model.id,
        max_attempts=svc.settings.worker.max_attempts,
        priority=priority,
    )
    payload = result.as_json()
    del payload["path"]
    payload.update(sha256=body.sha256, byte_size=body.size)
    return JSONResponse(payload, status_code=201 if result.status == "created" else 200)


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
