"""Bucket notifications: ``POST /v1/hooks/s3`` takes the S3 event JSON MinIO's webhook target
(and S3) sends, and makes the index follow the bucket.

Each record names a bucket, an event and a URL-encoded object key (spaces as ``+``). Records
of another bucket than ``storage.url``'s are refused, events other than ``ObjectCreated:*``,
``ObjectRemoved:*`` and lifecycle expirations are ignored, and so are trioindex's own blobs
(``sha256/...``, when the webhook watches the bucket trioindex stores in). For the others the
handler looks at the object as it is now, not at what the event says: an object that exists
is streamed once to hash it (:meth:`~trioindex.storage.AsyncObjectStore.digest`) and enqueued
as the document keyed by its object key, with the object itself as the version's blob
(``trioindex_enqueue_documents``: the same bytes twice are one version), through the
service's upload enqueuer, so concurrent notifications and uploads share one transaction
(:mod:`trioindex.http.enqueuer`); an object that is
gone deletes its document, rows only (the object was the application's; trioindex never
deletes it). So a notification delivered twice, late, or out of order still leaves the index
as the bucket is.

The answer lists one result per record (``enqueued``, ``unchanged``, ``deleted``, ``absent``,
``ignored``, or ``error`` with a code); a record that cannot be taken is an error for that
record only. A store or database that fails is 503, so MinIO delivers the event again.
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import unquote_plus

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from trioindex.db.documents import delete_documents
from trioindex.errors import ContentInvalid, ObjectNotFound
from trioindex.http.context import Service, service
from trioindex.http.enqueuer import StoredBody, Upload
from trioindex.http.errors import ApiError, invalid
from trioindex.http.limits import MAX_KEY_CHARS, read_json
from trioindex.ingest import NewVersion
from trioindex.storage import S3Location, check_key, parse_storage_url
from trioindex.storage.contract import DEFAULT_CONTENT_TYPE, OWN_BLOB_PREFIX

MAX_RECORDS: Final = 1000
_CREATED: Final = ("ObjectCreated:",)
_REMOVED: Final = ("ObjectRemoved:", "LifecycleExpiration:", "LifecycleDelMarkerExpiration:")


class RecordRefused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _bucket(svc: Service) -> str:
    url = svc.settings.storage.url
    location = parse_storage_url(url) if url else None
    if not isinstance(location, S3Location):
        raise ApiError(
            409, "webhook_needs_s3", "bucket notifications need storage.url to name an S3 bucket"
        )
    return location.bucket


def _field(record: Any, *path: str) -> Any:
    value = record
    for name in path:
        if not isinstance(value, dict) or name not in value:
            raise RecordRefused("invalid_record", f"the record has no {'.'.join(path)}")
        value = value[name]
    return value


def _object_key(record: Any) -> str:
    raw = _field(record, "s3", "object", "key")
    if not isinstance(raw, str):
        raise RecordRefused("invalid_record", "s3.object.key is not a string")
    try:
        key = unquote_plus(raw, errors="strict")
        check_key(key)
    except ValueError:  # UnicodeDecodeError too: a key is UTF-8
        raise RecordRefused(
            "invalid_key", "the object key is not one trioindex can store"
        ) from None
    if len(key) > MAX_KEY_CHARS or "\x00" in key:
        raise RecordRefused("invalid_key", f"the object key is over {MAX_KEY_CHARS} characters")
    return key


async def _follow(svc: Service, key: str) -> dict[str, Any]:
    """Make the document ``key`` what the object ``key`` is now."""
    store, db = svc.services.storage, svc.services.db
    try:
        info = await store.digest(key, max_bytes=svc.settings.parsing.max_document_bytes)
    except ObjectNotFound:
        removed = await db.run(delete_documents, [key])
        return {"key": key, "status": "deleted" if removed.deleted else "absent"}
    except ContentInvalid as exc:
        raise RecordRefused("document_too_large", str(exc)) from None
    assert info.sha256 is not None
    content_type = None if info.content_type == DEFAULT_CONTENT_TYPE else info.content_type
    version = NewVersion(
        document_key=key,
        storage_key=key,
        original_name=key.rsplit("/", 1)[-1],
        content_type=content_type,
        byte_size=info.size,
        sha256=info.sha256,
    )
    # with the uploads and other notifications enqueued meanwhile: one transaction for them all
    result = await svc.uploads.submit(Upload(StoredBody(version, was_intact=True)))
    status = "enqueued" if result.status == "created" else result.status
    return {
        "key": key,
        "status": status,
        "version_no": result.version_no,
        "job_id": str(result.job_id) if result.job_id else None,
    }


async def _record(svc: Service, bucket: str, record: Any) -> dict[str, Any]:
    event = _field(record, "eventName")
    if not isinstance(event, str):
        raise RecordRefused("invalid_record", "eventName is not a string")
    name = event.removeprefix("s3:")
    if not name.startswith(_CREATED + _REMOVED):
        return {"status": "ignored", "event": event}
    if _field(record, "s3", "bucket", "name") != bucket:
        raise RecordRefused("wrong_bucket", "the event is for another bucket than storage.url's")
    key = _object_key(record)
    if key.startswith(OWN_BLOB_PREFIX):
        return {"key": key, "status": "ignored", "event": event}
    return {"event": event, **await _follow(svc, key)}


async def s3_event(request: Request) -> Response:
    svc = service(request)
    svc.guard.check_webhook(request)
    bucket = _bucket(svc)
    body = await read_json(request)
    records = body.get("Records") if isinstance(body, dict) else None
    if not isinstance(records, list) or len(records) > MAX_RECORDS:
        raise invalid(
            f'the body must be S3 event JSON: {{"Records": [...]}} (at most {MAX_RECORDS})'
        )
    results = []
    for record in records:
        try:
            results.append(await _record(svc, bucket, record))
        except RecordRefused as exc:
            results.append({"status": "error", "code": exc.code, "message": exc.message})
    return JSONResponse({"records": results})
