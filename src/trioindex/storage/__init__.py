"""Object storage: one blocking contract, two stores, the URL grammar, and one Trio facade.

Modules:

* ``contract`` — :class:`ObjectInfo`, the synchronous :class:`ObjectStore` protocol (put / get /
  digest / stat / delete / ensure_ready / deferred_sync), the object-key rule and the checks
  both stores share;
* ``folder`` — :class:`FolderStore`, objects as files under a local folder (the embedded default);
* ``s3`` — :class:`S3Store`, MinIO / any S3 through the ``minio`` client;
* ``urls`` — the ``storage.url`` grammar (configuration validates with it, :func:`open_store`
  builds from it) and :func:`redact_url`, the one way a URL is shown;
* ``facade`` — :func:`open_store` and :class:`AsyncObjectStore`, the one place storage calls go
  through ``trio.to_thread`` (one call each, or several in one hop with ``run``).

No message, repr or log line carries a credential: stores describe themselves through
``description`` and URLs are shown through :func:`redact_url`. ``s3`` (and so ``minio``) is
imported on first use of its names, so commands that never touch S3 start without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trioindex.storage.contract import (
    DEFAULT_CONTENT_TYPE,
    SHA256_METADATA,
    ObjectInfo,
    ObjectStore,
    check_key,
)
from trioindex.storage.facade import AsyncObjectStore, open_store
from trioindex.storage.folder import FolderStore
from trioindex.storage.urls import (
    FolderLocation,
    S3Location,
    StorageUrlError,
    parse_storage_url,
    redact_url,
    storage_url_problem,
)

if TYPE_CHECKING:
    from trioindex.storage.s3 import S3Store, default_http_client


def __getattr__(name: str) -> Any:
    if name in ("S3Store", "default_http_client"):
        from trioindex.storage import s3

        return getattr(s3, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_CONTENT_TYPE",
    "SHA256_METADATA",
    "AsyncObjectStore",
    "FolderLocation",
    "FolderStore",
    "ObjectInfo",
    "ObjectStore",
    "S3Location",
    "S3Store",
    "StorageUrlError",
    "check_key",
    "default_http_client",
    "open_store",
    "parse_storage_url",
    "redact_url",
    "storage_url_problem",
]
