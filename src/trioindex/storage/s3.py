"""The S3 store: objects in one bucket of MinIO / any S3, through the blocking ``minio`` client.

Owns the HTTP policy a worker needs from it (:func:`default_http_client`: fail within seconds,
never wait on ``Retry-After``) and the mapping of S3 and transport errors onto
``ObjectNotFound`` / ``StorageUnavailable``, in our own words so no URL or server text leaks.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import BinaryIO, Final, Unpack

import attrs
import certifi
import urllib3
from minio import Minio
from minio.error import MinioException, S3Error

from trioindex.errors import ObjectNotFound, StorageUnavailable
from trioindex.storage.contract import (
    DEFAULT_CONTENT_TYPE,
    READ_PIECE,
    SHA256_METADATA,
    ObjectInfo,
    PutOptions,
    VerifyingReader,
    as_stream,
    check_key,
    check_max_bytes,
    check_put_args,
    digest_pieces,
    too_large,
)

logger = logging.getLogger(__name__)


@attrs.frozen
class ListedObject:
    """One object of a bucket listing: its key, size and ETag (quotes stripped)."""

    key: str
    size: int
    etag: str


def default_http_client(
    *, connect_timeout: float = 3.0, read_timeout: float = 30.0, retries: int = 2
) -> urllib3.PoolManager:
    """The urllib3 pool an :class:`S3Store` uses unless given one.

    minio's own default waits five minutes per connect and retries five times; a worker
    must instead see a down server within seconds and let the job's retry backoff take it
    from there. ``Retry-After`` is ignored for the same reason: it could hold a worker
    thread for as long as the server asks.
    """
    return urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=connect_timeout, read=read_timeout),
        maxsize=10,
        cert_reqs="CERT_REQUIRED",
        ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
        retries=urllib3.Retry(
            total=retries,
            backoff_factor=0.2,
            status_forcelist=(500, 502, 503, 504),
            respect_retry_after_header=False,
        ),
    )


_NOT_FOUND_CODES: Final = frozenset({"NoSuchKey", "NoSuchObject"})


@attrs.define(eq=False)
class S3Store:
    """Objects in one bucket of MinIO / any S3, through the (blocking) ``minio`` client.

    The SHA-256 travels as object metadata (``x-amz-meta-sha256``). Errors are mapped:
    ``NoSuchKey`` → ``ObjectNotFound``; connection failures, timeouts, 5xx and every other
    S3 error code (bad credentials, missing bucket, ...) → ``StorageUnavailable``.
    ``http_client`` is the place for timeout / retry policy (see :func:`default_http_client`).
    """

    endpoint: str  # host:port
    bucket: str
    access_key: str | None = attrs.field(default=None, repr=False)
    secret_key: str | None = attrs.field(default=None, repr=False)
    secure: bool = True
    region: str | None = None
    http_client: urllib3.PoolManager | None = attrs.field(default=None, repr=False)
    _client: Minio = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self._client = Minio(
            self.endpoint,
            access_key=self.access_key,
            secret_key=self.secret_key,
            secure=self.secure,
            region=self.region,
            http_client=self.http_client or default_http_client(),
        )

    @property
    def description(self) -> str:
        scheme = "https" if self.secure else "http"
        return f"s3 {scheme}://{self.endpoint} bucket {self.bucket}"

    def _error(self, action: str, key: str | None, exc: Exception) -> StorageUnavailable:
        # Only our own words plus the S3 error code / exception class: urllib3 and S3 error
        # strings can carry URLs and server text we do not want in a job row.
        what = f" {key!r}" if key is not None else ""
        if isinstance(exc, S3Error):
            if key is not None and exc.code in _NOT_FOUND_CODES:
                return ObjectNotFound(f"{self.description}: no object {key!r}")
            reason = f"S3 error {exc.code}"
        elif isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
            reason = f"{type(exc.reason).__name__} after retries"
        else:
            reason = type(exc).__name__
        return StorageUnavailable(f"{self.description}: {action}{what} failed: {reason}")

    def ensure_ready(self) -> None:
        try:
            if self._client.bucket_exists(self.bucket):
                return
            try:
                self._client.make_bucket(self.bucket, location=self.region)
            except S3Error as exc:
                # Another worker created it between our check and our create.
                if exc.code != "BucketAlreadyOwnedByYou":
                    raise
            logger.info("created bucket for %s", self.description)
        except (MinioException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise self._error("ensure bucket", None, exc) from exc

    def deferred_sync(self) -> contextlib.nullcontext[None]:
        # an S3 PUT is durable when it returns: nothing to defer
        return contextlib.nullcontext()

    def put(self, key: str, data: bytes | BinaryIO, **options: Unpack[PutOptions]) -> ObjectInfo:
        size, sha256, content_type = options["size"], options["sha256"], options["content_type"]
        check_key(key)
        check_put_args(size, sha256)
        content_type = content_type or DEFAULT_CONTENT_TYPE
        reader = VerifyingReader(as_stream(data), size, sha256)
        if size == 0:
            reader.read()  # minio never reads an empty body, so verify its hash here
        try:
            self._client.put_object(
                self.bucket,
                key,
                reader,  # type: ignore[arg-type]  # minio only calls read()
                length=size,
                content_type=content_type,
                metadata={SHA256_METADATA: sha256},
            )
        except (MinioException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise self._error("put", key, exc) from exc
        logger.debug("stored %r (%d bytes) in %s", key, size, self.description)
        return ObjectInfo(key=key, size=size, sha256=sha256, content_type=content_type)

    def get(self, key: str, *, max_bytes: int) -> bytes:
        check_max_bytes(max_bytes)
        info = self.stat(key)
        if info.size > max_bytes:
            raise too_large(key, info.size, max_bytes)
        if info.size == 0:
            return b""  # a ranged GET of an empty object is a 416 on some servers
        try:
            # The range caps the transfer at max_bytes + 1 even if the object was replaced
            # by a larger one after the stat.
            response = self._client.get_object(self.bucket, key, offset=0, length=max_bytes + 1)
            try:
                body = response.read(max_bytes + 1)
            finally:
                response.close()
                response.release_conn()
        except (MinioException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise self._error("get", key, exc) from exc
        if len(body) > max_bytes:
            raise too_large(key, len(body), max_bytes)
        return body

    def digest(self, key: str, *, max_bytes: int) -> ObjectInfo:
        check_max_bytes(max_bytes)
        info = self.stat(key)
        if info.size > max_bytes:
            raise too_large(key, info.size, max_bytes)
        if info.size == 0:
            return attrs.evolve(info, sha256=digest_pieces(key, (), max_bytes)[0])
        try:
            # ranged as in get: never more than max_bytes + 1, even if the object was replaced
            response = self._client.get_object(self.bucket, key, offset=0, length=max_bytes + 1)
            try:
                sha256, size = digest_pieces(key, response.stream(READ_PIECE), max_bytes)
            finally:
                response.close()
                response.release_conn()
        except (MinioException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise self._error("get", key, exc) from exc
        return attrs.evolve(info, size=size, sha256=sha256)

    def delete(self, key: str) -> None:
        check_key(key)
        try:
            self._client.remove_object(self.bucket, key)  # S3 answers 204 for a missing key
        except (MinioException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise self._error("delete", key, exc) from exc
        logger.debug("deleted %r from %s", key, self.description)

    def list_objects(self, prefix: str) -> Iterator[ListedObject]:
        """Every object whose key starts with ``prefix``, in key order (S3's listing order),
        with its size and ETag; the listing is paged by the client."""
        try:
            for obj in self._client.list_objects(self.bucket, prefix=prefix, recursive=True):
                if obj.is_dir or obj.object_name is None:
                    continue
                yield ListedObject(obj.object_name, int(obj.size or 0), (obj.etag or "").strip('"'))
        except (MinioException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise self._error("list", prefix or None, exc) from exc

    def stat(self, key: str) -> ObjectInfo:
        check_key(key)
        try:
            obj = self._client.stat_object(self.bucket, key)
        except (MinioException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise self._error("stat", key, exc) from exc
        sha256 = obj.metadata.get(f"x-amz-meta-{SHA256_METADATA}") if obj.metadata else None
        return ObjectInfo(
            key=key,
            size=int(obj.size or 0),
            sha256=sha256 if isinstance(sha256, str) and sha256 else None,
            content_type=obj.content_type,
        )
