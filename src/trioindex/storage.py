"""Object storage: one blocking contract, two stores, and the only Trio facade over them.

Owns
  * :class:`ObjectStore` — the synchronous contract (put / get / stat / ensure_ready);
  * :class:`FolderStore` — objects as files under a local folder (the embedded default);
  * :class:`S3Store` — MinIO / any S3 through the ``minio`` client;
  * :func:`open_store` / :func:`redact_url` — the ``storage.url`` forms
    ``file:///abs/path`` and ``s3://KEY:SECRET@host:port/bucket?secure=false&region=r``;
  * :class:`AsyncObjectStore` — the one place storage calls go through ``trio.to_thread``.

Errors leave this module already classified (``trioindex.errors``)::

    ObjectNotFound      the key is not in the store
    StorageUnavailable  the store cannot be reached or refused the call (retryable)
    ContentInvalid      the object is larger than the caller's ``max_bytes``
    ValueError          a caller bug: a key escaping the root, or data that does not match
                        the ``size`` / ``sha256`` it was put with

No message, repr or log line carries a credential: stores describe themselves through
``description`` and URLs are logged through :func:`redact_url`.

Keys are relative ``/``-separated paths whose segments are non-empty and do not start with
``.`` (so no ``.``/``..``, and no clash with the folder store's hidden temp and sidecar
files). Both stores enforce the same rule so a key that works on one works on the other.
A ``put`` without a content type stores ``application/octet-stream``, as S3 would.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import os
import re
import tempfile
import urllib.parse
from pathlib import Path
from typing import IO, BinaryIO, Final, Protocol

import attrs
import certifi
import trio
import urllib3
from minio import Minio
from minio.error import MinioException, S3Error

from trioindex.errors import ConfigError, ContentInvalid, ObjectNotFound, StorageUnavailable

logger = logging.getLogger(__name__)

DEFAULT_CONTENT_TYPE: Final = "application/octet-stream"
SHA256_METADATA: Final = "sha256"  # travels as the x-amz-meta-sha256 header
_CHUNK = 1024 * 1024
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


@attrs.frozen
class ObjectInfo:
    """What a store knows about one object; ``sha256`` is lower-case hex, None if unknown."""

    key: str
    size: int
    sha256: str | None
    content_type: str | None


class ObjectStore(Protocol):
    """The synchronous storage contract; every method blocks (see :class:`AsyncObjectStore`)."""

    @property
    def description(self) -> str:
        """Safe for logs: where the objects live, never a credential."""
        ...

    def put(
        self,
        key: str,
        data: bytes | BinaryIO,
        *,
        size: int,
        sha256: str,
        content_type: str | None,
    ) -> ObjectInfo:
        """Store exactly ``size`` bytes, atomically replacing any object under ``key``.

        A stream is read for exactly ``size`` bytes; a short stream or a SHA-256 that does
        not match raises ``ValueError`` and leaves any previous object in place.
        """
        ...

    def get(self, key: str, *, max_bytes: int) -> bytes:
        """The object's bytes; ``ContentInvalid`` if it is larger than ``max_bytes``.

        Never reads more than ``max_bytes + 1`` bytes, even if the object grows meanwhile.
        """
        ...

    def stat(self, key: str) -> ObjectInfo: ...

    def ensure_ready(self) -> None:
        """Create the bucket / folder if missing; ``StorageUnavailable`` if that fails."""
        ...


# --- shared helpers ---------------------------------------------------------------------


def check_key(key: str) -> str:
    """Return ``key`` if it is a valid relative object key, else raise ``ValueError``."""
    if not key or key.startswith("/") or "\\" in key or "\x00" in key:
        raise ValueError(f"invalid object key {key!r}: must be a relative '/'-separated path")
    for segment in key.split("/"):
        if not segment or segment.startswith("."):
            raise ValueError(f"invalid object key {key!r}: empty or '.'-prefixed path segment")
    return key


def _check_put_args(size: int, sha256: str) -> None:
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    if not _SHA256_HEX.fullmatch(sha256):
        raise ValueError("sha256 must be 64 lower-case hex digits")


def _check_max_bytes(max_bytes: int) -> None:
    if max_bytes < 0:
        raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")


def _too_large(key: str, size: int, max_bytes: int) -> ContentInvalid:
    return ContentInvalid(
        f"file over the maximum size: object {key!r} has {size} bytes, limit is {max_bytes}"
    )


class _VerifyingReader:
    """Reads exactly ``size`` bytes from ``source`` and checks their SHA-256 at the end.

    The check fires on the read that delivers the last byte, i.e. before the store commits
    the object (the temp file is not renamed; minio has not sent the single part, or aborts
    the multipart upload), so a mismatching object never becomes visible.
    """

    def __init__(self, source: IO[bytes], size: int, sha256: str) -> None:
        self._source = source
        self._remaining = size
        self._size = size
        self._expected = sha256
        self._hash = hashlib.sha256()
        self._verified = False

    def read(self, n: int = -1) -> bytes:
        if self._remaining == 0:
            self._verify()
            return b""
        want = self._remaining if n is None or n < 0 else min(n, self._remaining)
        data = self._source.read(want)
        if not data:
            raise ValueError(
                f"stream ended after {self._size - self._remaining} of {self._size} bytes"
            )
        self._remaining -= len(data)
        self._hash.update(data)
        if self._remaining == 0:
            self._verify()
        return data

    def _verify(self) -> None:
        if not self._verified:
            if self._hash.hexdigest() != self._expected:
                raise ValueError("data does not match the sha256 it was put with")
            self._verified = True


def _as_stream(data: bytes | BinaryIO) -> IO[bytes]:
    return io.BytesIO(data) if isinstance(data, bytes | bytearray | memoryview) else data


# --- folder store -----------------------------------------------------------------------


@attrs.define(eq=False)
class FolderStore:
    """Objects as plain files under ``root`` (the embedded default ``file://`` store).

    ``put`` writes a hidden temp file in the target directory, fsyncs it and
    ``os.replace``-s it over the key, so readers see the old or the new object, never a
    part. The SHA-256 and content type live in a hidden sidecar ``.<name>.meta.json`` next
    to the file, written (atomically) before the rename and stamped with the new file's
    size, inode and mtime. If a crash leaves the sidecar out of step with the file, ``stat``
    notices the stamp mismatch and recomputes the SHA-256 from the file (content type then
    reads as None): the reported hash is always that of the bytes on disk.

    A missing root, a root that is not a directory, and any other OS error are
    ``StorageUnavailable`` (the "server is down" of a folder).
    """

    root: Path = attrs.field(converter=Path)

    def __attrs_post_init__(self) -> None:
        if not self.root.is_absolute():
            raise ValueError(f"folder store root must be absolute, got {str(self.root)!r}")

    @property
    def description(self) -> str:
        return f"folder {self.root}"

    # paths

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    @staticmethod
    def _sidecar(path: Path) -> Path:
        return path.with_name(f".{path.name}.meta.json")

    def _unavailable(self, action: str, key: str | None, exc: OSError) -> StorageUnavailable:
        what = f" {key!r}" if key is not None else ""
        return StorageUnavailable(
            f"{self.description}: cannot {action}{what}: {type(exc).__name__}"
            + (f" ({exc.strerror})" if exc.strerror else "")
        )

    def _missing(self, key: str, exc: OSError) -> StorageUnavailable:
        # "Not found" only counts when the root itself is there; a vanished or replaced root
        # is the folder equivalent of a server that is down.
        if not self.root.is_dir():
            return StorageUnavailable(f"{self.description}: root folder is missing")
        if isinstance(exc, FileNotFoundError | NotADirectoryError | IsADirectoryError):
            return ObjectNotFound(f"{self.description}: no object {key!r}")
        return self._unavailable("read", key, exc)

    # contract

    def ensure_ready(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._unavailable("create root folder", None, exc) from exc
        if not os.access(self.root, os.R_OK | os.W_OK | os.X_OK):
            raise StorageUnavailable(f"{self.description}: root folder is not writable")

    def put(
        self,
        key: str,
        data: bytes | BinaryIO,
        *,
        size: int,
        sha256: str,
        content_type: str | None,
    ) -> ObjectInfo:
        path = self._path(key)
        _check_put_args(size, sha256)
        content_type = content_type or DEFAULT_CONTENT_TYPE
        reader = _VerifyingReader(_as_stream(data), size, sha256)
        if not self.root.is_dir():
            raise StorageUnavailable(f"{self.description}: root folder is missing")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        except OSError as exc:
            raise self._unavailable("write", key, exc) from exc
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := reader.read(_CHUNK):
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
                st = os.fstat(out.fileno())
            meta = {
                "sha256": sha256,
                "content_type": content_type,
                "size": st.st_size,
                "ino": st.st_ino,
                "mtime_ns": st.st_mtime_ns,
            }
            self._write_atomic(self._sidecar(path), json.dumps(meta).encode())
            os.replace(tmp, path)
            self._fsync_dir(path.parent)
        except OSError as exc:
            raise self._unavailable("write", key, exc) from exc
        finally:
            tmp.unlink(missing_ok=True)
        logger.debug("stored %r (%d bytes) in %s", key, size, self.description)
        return ObjectInfo(key=key, size=size, sha256=sha256, content_type=content_type)

    def get(self, key: str, *, max_bytes: int) -> bytes:
        _check_max_bytes(max_bytes)
        path = self._path(key)
        try:
            with path.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > max_bytes:
                    raise _too_large(key, size, max_bytes)
                body = f.read(max_bytes + 1)
        except OSError as exc:
            raise self._missing(key, exc) from exc
        if len(body) > max_bytes:  # the file grew after fstat
            raise _too_large(key, len(body), max_bytes)
        return body

    def stat(self, key: str) -> ObjectInfo:
        path = self._path(key)
        try:
            st = path.stat()
        except OSError as exc:
            raise self._missing(key, exc) from exc
        if not path.is_file():
            raise ObjectNotFound(f"{self.description}: no object {key!r}")
        meta = self._read_sidecar(path)
        stamp_ok = meta is not None and (
            meta.get("size"),
            meta.get("ino"),
            meta.get("mtime_ns"),
        ) == (st.st_size, st.st_ino, st.st_mtime_ns)
        if meta is not None and stamp_ok:
            sha256 = meta.get("sha256")
            content_type = meta.get("content_type")
            return ObjectInfo(
                key=key,
                size=st.st_size,
                sha256=sha256 if isinstance(sha256, str) else None,
                content_type=content_type if isinstance(content_type, str) else None,
            )
        logger.warning(
            "%s: sidecar of %r missing or stale; recomputing sha256", self.description, key
        )
        try:
            with path.open("rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
        except OSError as exc:
            raise self._missing(key, exc) from exc
        return ObjectInfo(key=key, size=st.st_size, sha256=digest, content_type=None)

    # helpers

    @staticmethod
    def _read_sidecar(path: Path) -> dict[str, object] | None:
        try:
            meta = json.loads(FolderStore._sidecar(path).read_bytes())
        except (OSError, ValueError):
            return None
        return meta if isinstance(meta, dict) else None

    @staticmethod
    def _write_atomic(path: Path, payload: bytes) -> None:
        fd, tmp_name = tempfile.mkstemp(prefix=f"{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(payload)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp_name, path)
        finally:
            Path(tmp_name).unlink(missing_ok=True)

    @staticmethod
    def _fsync_dir(directory: Path) -> None:
        # Makes the rename itself durable; not every platform can open a directory.
        try:
            fd = os.open(directory, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


# --- S3 store ---------------------------------------------------------------------------


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

    def put(
        self,
        key: str,
        data: bytes | BinaryIO,
        *,
        size: int,
        sha256: str,
        content_type: str | None,
    ) -> ObjectInfo:
        check_key(key)
        _check_put_args(size, sha256)
        content_type = content_type or DEFAULT_CONTENT_TYPE
        reader = _VerifyingReader(_as_stream(data), size, sha256)
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
        _check_max_bytes(max_bytes)
        info = self.stat(key)
        if info.size > max_bytes:
            raise _too_large(key, info.size, max_bytes)
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
            raise _too_large(key, len(body), max_bytes)
        return body

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


# --- URLs -------------------------------------------------------------------------------

_USERINFO = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>.*)@", re.DOTALL)


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (``s3://KEY:***@host:port/bucket``).

    Works on malformed URLs too and errs towards hiding more: the user-info runs to the
    last ``@``, so a secret holding an unescaped ``@`` or ``/`` is still masked.
    """
    match = _USERINFO.match(url)
    if match is None:
        return url
    user, sep, _password = match["userinfo"].partition(":")
    masked = f"{user}:***" if sep else "***"
    return f"{match['head']}{masked}@{url[match.end() :]}"


_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


def open_store(url: str) -> ObjectStore:
    """A store for a ``storage.url``; ``ConfigError`` (naming the key, not the secret) if bad.

    * ``file:///abs/path`` (or ``file://localhost/abs/path``); ``file://./rel`` and
      ``file://.trioindex/blobs`` are relative to the working directory.
    * ``s3://KEY:SECRET@host[:port]/bucket[?secure=false][&region=R]`` — ``secure``
      defaults to true; key and secret are percent-decoded and may both be omitted
      (anonymous access).
    """
    safe = redact_url(url)

    def bad(reason: str) -> ConfigError:
        return ConfigError(f"storage.url: {reason} (got {safe!r})")

    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise bad("not a valid URL") from None
    if parts.scheme == "file":
        return _open_folder(parts, bad)
    if parts.scheme == "s3":
        return _open_s3(parts, port, bad)
    raise bad("scheme must be file:// or s3://")


def _open_folder(parts: urllib.parse.SplitResult, bad: _Bad) -> FolderStore:
    if parts.query or parts.fragment:
        raise bad("a file:// URL takes no query or fragment")
    path = urllib.parse.unquote(parts.path)
    if parts.netloc in ("", "localhost"):
        if not path.startswith("/"):
            raise bad("a file:// URL needs a path")
        root = Path(path)
    elif parts.netloc.startswith("."):
        # The documented embedded default file://.trioindex/blobs is relative.
        root = Path.cwd() / (urllib.parse.unquote(parts.netloc) + path)
    else:
        raise bad("a file:// URL cannot name a remote host")
    return FolderStore(Path(os.path.normpath(root)))


def _open_s3(parts: urllib.parse.SplitResult, port: int | None, bad: _Bad) -> S3Store:
    if not parts.hostname:
        raise bad("an s3:// URL needs a host")
    bucket = parts.path.strip("/")
    if not bucket or "/" in bucket:
        raise bad("an s3:// URL needs exactly one path segment, the bucket")
    if parts.fragment:
        raise bad("an s3:// URL takes no fragment")
    try:
        query = urllib.parse.parse_qs(parts.query, keep_blank_values=True, strict_parsing=False)
    except ValueError:
        raise bad("invalid query string") from None
    unknown = set(query) - {"secure", "region"}
    if unknown:
        raise bad(f"unknown query parameter(s) {', '.join(sorted(unknown))}")
    secure = True
    if "secure" in query:
        value = query["secure"][-1].lower()
        if value not in _TRUE | _FALSE:
            raise bad("secure must be true or false")
        secure = value in _TRUE
    region = query["region"][-1] if "region" in query else None
    access_key = urllib.parse.unquote(parts.username) if parts.username is not None else None
    secret_key = urllib.parse.unquote(parts.password) if parts.password is not None else None
    if (access_key is None) != (secret_key is None) or access_key == "" or secret_key == "":
        raise bad("give both the access key and the secret (KEY:SECRET@), or neither")
    host = parts.hostname
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    endpoint = f"{host}:{port}" if port is not None else host
    try:
        return S3Store(
            endpoint=endpoint,
            bucket=bucket,
            access_key=access_key,
            secret_key=secret_key,
            secure=secure,
            region=region or None,
        )
    except ValueError:
        # minio validates the endpoint; its message is not needed to fix the URL.
        raise bad("invalid S3 endpoint") from None


class _Bad(Protocol):
    def __call__(self, reason: str) -> ConfigError: ...


# --- the Trio facade --------------------------------------------------------------------


@attrs.define(eq=False)
class AsyncObjectStore:
    """Runs an :class:`ObjectStore` in worker threads, bounded by ``limiter``.

    Cancellation handling: calls use ``trio.to_thread.run_sync`` with the default
    ``abandon_on_cancel=False``, so a cancelled caller waits for the blocking call to end
    (bounded by the store's own connect/read timeouts) and no thread outlives its caller.
    """

    store: ObjectStore
    limiter: trio.CapacityLimiter = attrs.field(repr=False)

    @property
    def description(self) -> str:
        return self.store.description

    async def put(
        self,
        key: str,
        data: bytes | BinaryIO,
        *,
        size: int,
        sha256: str,
        content_type: str | None,
    ) -> ObjectInfo:
        call = functools.partial(
            self.store.put, key, data, size=size, sha256=sha256, content_type=content_type
        )
        return await trio.to_thread.run_sync(call, limiter=self.limiter)

    async def get(self, key: str, *, max_bytes: int) -> bytes:
        call = functools.partial(self.store.get, key, max_bytes=max_bytes)
        return await trio.to_thread.run_sync(call, limiter=self.limiter)

    async def stat(self, key: str) -> ObjectInfo:
        return await trio.to_thread.run_sync(self.store.stat, key, limiter=self.limiter)

    async def ensure_ready(self) -> None:
        await trio.to_thread.run_sync(self.store.ensure_ready, limiter=self.limiter)
