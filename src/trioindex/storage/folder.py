"""The folder store: objects as files under a local folder (the embedded default).

Writes are atomic (temp file, fsync, rename; in a ``deferred_sync`` block a new key's fsyncs wait
for the block's end) and the SHA-256 and content type live in a hidden sidecar next to each file;
see :class:`FolderStore` for how a crash between the two is noticed.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Final, Unpack

import attrs

from trioindex.errors import ObjectNotFound, StorageUnavailable
from trioindex.storage.contract import (
    DEFAULT_CONTENT_TYPE,
    READ_PIECE,
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
class _Unsynced:
    """A put inside a :meth:`FolderStore.deferred_sync` block: its still open file (``synced``:
    already fsynced, because it replaced a published key) and the folder of its rename."""

    file: BinaryIO
    key: str
    folder: Path
    synced: bool


_CHUNK = 1024 * 1024
# what fsync of a directory answers where directories cannot be synced (nothing to make durable)
_DIRECTORY_FSYNC_UNSUPPORTED: Final = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EBADF})


@attrs.define(eq=False)
class FolderStore:
    """Objects as plain files under ``root`` (the embedded default ``file://`` store).

    ``put`` writes a hidden temp file in the target directory, fsyncs it and
    ``os.replace``-s it over the key, so readers see the old or the new object, never a
    part. The SHA-256 and content type live in a hidden sidecar ``.<name>.meta.json`` next
    to the file, written (atomically) before the rename and stamped with the new file's
    size, inode and mtime. If a crash leaves the sidecar out of step with the file, ``stat``
    notices the stamp mismatch and recomputes the SHA-256 from the file (content type then
    reads as None): the reported hash is always that of the bytes on disk. So the sidecar is
    not fsynced: a crash that loses or truncates it costs one recomputation at the next
    ``stat``, never a wrong answer, and two fsyncs per object (file, folder) instead of three
    are what an upload waits for.

    Inside :meth:`deferred_sync` a thread's puts of new keys skip both fsyncs and the block's
    end makes them, through each file's still open descriptor (so a write-back error is not
    missed), then each folder once. On ext4 (``data=ordered``) the first fsync commits the
    journal with every rename and every file's data in it, so the rest cost little: a slice of
    small files waits for about one disk flush instead of two per file; elsewhere each file is
    still fsynced, only later. A put over a key that exists fsyncs its file before the rename
    even in a block: that key may be what committed versions point at, and must never name
    bytes that are not on disk. Nested blocks: the outermost one syncs.

    A missing root, a root that is not a directory, and any other OS error are
    ``StorageUnavailable`` (the "server is down" of a folder).
    """

    root: Path = attrs.field(converter=Path)
    # per thread: the puts made inside a deferred_sync block, None outside one
    _deferred: threading.local = attrs.field(factory=threading.local, init=False, repr=False)

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

    def put(self, key: str, data: bytes | BinaryIO, **options: Unpack[PutOptions]) -> ObjectInfo:
        size, sha256, content_type = options["size"], options["sha256"], options["content_type"]
        path = self._path(key)
        check_put_args(size, sha256)
        content_type = content_type or DEFAULT_CONTENT_TYPE
        reader = VerifyingReader(as_stream(data), size, sha256)
        deferred: list[_Unsynced] | None = getattr(self._deferred, "pending", None)
        if not self.root.is_dir():
            raise StorageUnavailable(f"{self.description}: root folder is missing")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        except OSError as exc:
            raise self._unavailable("write", key, exc) from exc
        tmp = Path(tmp_name)
        out = os.fdopen(fd, "wb")
        handed_over = False
        try:
            while chunk := reader.read(_CHUNK):
                out.write(chunk)
            out.flush()
            # A key that exists is published already (versions may point at it): its new bytes
            # reach the disk before the rename, in a deferred block too.
            synced = deferred is None or os.path.lexists(path)
            if synced:
                os.fsync(out.fileno())
            st = os.fstat(out.fileno())
            meta = {
                "sha256": sha256,
                "content_type": content_type,
                "size": st.st_size,
                "ino": st.st_ino,
                "mtime_ns": st.st_mtime_ns,
            }
            self._write_sidecar(self._sidecar(path), json.dumps(meta).encode())
            os.replace(tmp, path)
            if deferred is None:
                self._fsync_dir(path.parent)
            else:
                # the open file is fsynced at the block's end: through the descriptor that
                # wrote it, so a write-back error cannot be missed by a later open
                deferred.append(_Unsynced(out, key, path.parent, synced))
                handed_over = True
        except OSError as exc:
            raise self._unavailable("write", key, exc) from exc
        finally:
            if not handed_over:
                out.close()
            tmp.unlink(missing_ok=True)
        logger.debug("stored %r (%d bytes) in %s", key, size, self.description)
        return ObjectInfo(key=key, size=size, sha256=sha256, content_type=content_type)

    @contextlib.contextmanager
    def deferred_sync(self) -> Iterator[None]:
        if getattr(self._deferred, "pending", None) is not None:
            yield  # nested: the outermost block syncs
            return
        pending: list[_Unsynced] = []
        self._deferred.pending = pending
        try:
            try:
                yield
            finally:
                self._deferred.pending = None
            self._sync(pending)
        finally:
            for unsynced in pending:
                unsynced.file.close()

    def _sync(self, pending: list[_Unsynced]) -> None:
        for unsynced in pending:
            if not unsynced.synced:
                try:
                    os.fsync(unsynced.file.fileno())
                except OSError as exc:
                    raise self._unavailable("sync", unsynced.key, exc) from exc
        for directory in dict.fromkeys(unsynced.folder for unsynced in pending):
            try:
                self._fsync_dir(directory)
            except OSError as exc:
                raise self._unavailable("sync", directory.name, exc) from exc

    def get(self, key: str, *, max_bytes: int) -> bytes:
        check_max_bytes(max_bytes)
        path = self._path(key)
        try:
            with path.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > max_bytes:
                    raise too_large(key, size, max_bytes)
                # a read allocates what it is asked for before it reads: the size fstat saw
                # and a byte, not the limit (50 MB by default, for a file of 600 bytes); a
                # file that grew since is read on, up to the limit and a byte
                body = f.read(size + 1)
                if len(body) > size:
                    body += f.read(max_bytes - size)
        except OSError as exc:
            raise self._missing(key, exc) from exc
        if len(body) > max_bytes:  # the file grew after fstat
            raise too_large(key, len(body), max_bytes)
        return body

    def digest(self, key: str, *, max_bytes: int) -> ObjectInfo:
        check_max_bytes(max_bytes)
        path = self._path(key)
        try:
            with path.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > max_bytes:
                    raise too_large(key, size, max_bytes)
                sha256, size = digest_pieces(key, iter(lambda: f.read(READ_PIECE), b""), max_bytes)
        except OSError as exc:
            raise self._missing(key, exc) from exc
        meta = self._read_sidecar(path)
        content_type = meta.get("content_type") if meta is not None else None
        return ObjectInfo(
            key=key,
            size=size,
            sha256=sha256,
            content_type=content_type if isinstance(content_type, str) else None,
        )

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

    def delete(self, key: str) -> None:
        path = self._path(key)
        if not self.root.is_dir():
            raise StorageUnavailable(f"{self.description}: root folder is missing")
        try:
            path.unlink(missing_ok=True)
            self._sidecar(path).unlink(missing_ok=True)
        except OSError as exc:
            raise self._unavailable("delete", key, exc) from exc
        logger.debug("deleted %r from %s", key, self.description)

    # helpers

    @staticmethod
    def _read_sidecar(path: Path) -> dict[str, object] | None:
        try:
            meta = json.loads(FolderStore._sidecar(path).read_bytes())
        except (OSError, ValueError):
            return None
        return meta if isinstance(meta, dict) else None

    @staticmethod
    def _write_sidecar(path: Path, payload: bytes) -> None:
        # atomic (readers see the old sidecar or the new one) but not fsynced: see the class
        # docstring for why a sidecar lost in a crash is harmless
        fd, tmp_name = tempfile.mkstemp(prefix=f"{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(payload)
            os.replace(tmp_name, path)
        finally:
            Path(tmp_name).unlink(missing_ok=True)

    @staticmethod
    def _fsync_dir(directory: Path) -> None:
        # Makes the renames in it durable. A platform or file system that cannot open or fsync
        # a directory has nothing to do here; any other error (EIO) is a write that failed.
        try:
            fd = os.open(directory, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError as exc:
            if exc.errno not in _DIRECTORY_FSYNC_UNSUPPORTED:
                raise
        finally:
            os.close(fd)
