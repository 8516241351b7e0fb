"""Object storage: one contract run on the folder store and on S3 (moto / MinIO on loopback).

Also: store-specific behaviour (atomic folder writes, S3 metadata and ranged reads), URL
parsing and redaction, credentials never leaking, and the Trio facade's thread discipline.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import logging
import os
import pwd
import shutil
import signal
import socket
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import pytest
import trio
import trio.testing
import urllib3
from hypothesis import assume, given
from hypothesis import strategies as st

from trioindex.errors import ConfigError, ContentInvalid, ObjectNotFound, StorageUnavailable
from trioindex.storage import (
    DEFAULT_CONTENT_TYPE,
    AsyncObjectStore,
    FolderStore,
    ObjectInfo,
    ObjectStore,
    S3Store,
    open_store,
    redact_url,
)

if TYPE_CHECKING:
    from tests.fixtures.s3 import S3Server

# Idempotent if the root conftest lists it too. (Imported only as a plugin, so that pytest
# rewrites its asserts.)
pytest_plugins = ["tests.fixtures.s3"]

# For stores pointed at a closed port: no server needed to check that it never leaks.
DOWN_SECRET = "down-s3cr3t-" + uuid.uuid4().hex

MiB = 1024 * 1024


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def put_bytes(
    store: ObjectStore, key: str, data: bytes, content_type: str | None = "text/plain"
) -> ObjectInfo:
    return store.put(key, data, size=len(data), sha256=sha(data), content_type=content_type)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def assert_no_secret(secret: str, *texts: object) -> None:
    for text in texts:
        assert secret not in str(text)
        assert secret not in repr(text)


def assert_error_safe(secret: str, exc: BaseException) -> None:
    assert_no_secret(secret, exc, "".join(traceback.format_exception(exc)))


@pytest.fixture(params=["folder", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "folder":
        folder = FolderStore(tmp_path / "blobs")
        folder.ensure_ready()
        return folder
    s3 = open_store(request.getfixturevalue("s3_url"))
    s3.ensure_ready()
    return s3


# --- the contract, on both stores -------------------------------------------------------


def test_put_get_round_trip_bytes(store: ObjectStore) -> None:
    data = b"hello \x00\xff world"
    info = put_bytes(store, "docs/a/hello.txt", data)
    assert info == ObjectInfo("docs/a/hello.txt", len(data), sha(data), "text/plain")
    assert store.get("docs/a/hello.txt", max_bytes=len(data)) == data


def test_put_get_round_trip_stream_multipart_sized(store: ObjectStore) -> None:
    # > 5 MiB, so minio uploads it in two parts.
    data = os.urandom(5 * MiB + 1234)
    stream: BinaryIO = io.BytesIO(data)
    store.put("big.bin", stream, size=len(data), sha256=sha(data), content_type=None)
    assert store.get("big.bin", max_bytes=6 * MiB) == data
    assert store.stat("big.bin") == ObjectInfo(
        "big.bin", len(data), sha(data), DEFAULT_CONTENT_TYPE
    )


def test_put_reads_exactly_size_bytes_from_a_stream(store: ObjectStore) -> None:
    stream = io.BytesIO(b"abcdefTAIL")
    store.put("k", stream, size=6, sha256=sha(b"abcdef"), content_type=None)
    assert store.get("k", max_bytes=100) == b"abcdef"
    assert stream.read() == b"TAIL"


def test_stat_reports_size_sha256_content_type(store: ObjectStore) -> None:
    data = b"%PDF-1.7 not really"
    put_bytes(store, "v1/doc.pdf", data, content_type="application/pdf")
    assert store.stat("v1/doc.pdf") == ObjectInfo(
        key="v1/doc.pdf", size=len(data), sha256=sha(data), content_type="application/pdf"
    )


def test_put_replaces_an_existing_object(store: ObjectStore) -> None:
    put_bytes(store, "k", b"old contents")
    put_bytes(store, "k", b"new", content_type="text/markdown")
    assert store.get("k", max_bytes=100) == b"new"
    assert store.stat("k") == ObjectInfo("k", 3, sha(b"new"), "text/markdown")


def test_delete_removes_the_object_and_is_idempotent(store: ObjectStore) -> None:
    put_bytes(store, "sha256/ab/gone", b"bytes")
    put_bytes(store, "sha256/ab/kept", b"other")
    store.delete("sha256/ab/gone")
    with pytest.raises(ObjectNotFound):
        store.stat("sha256/ab/gone")
    store.delete("sha256/ab/gone")  # already gone: not an error
    assert store.get("sha256/ab/kept", max_bytes=10) == b"other"


def test_empty_object(store: ObjectStore) -> None:
    put_bytes(store, "empty", b"")
    assert store.get("empty", max_bytes=0) == b""
    assert store.stat("empty").size == 0


@pytest.mark.parametrize("op", ["get", "stat"])
def test_missing_object_is_object_not_found(store: ObjectStore, op: str) -> None:
    put_bytes(store, "dir/present", b"x")
    for key in ["absent", "dir/absent", "dir/present/below", "dir"]:
        with pytest.raises(ObjectNotFound) as info:
            store.get(key, max_bytes=10) if op == "get" else store.stat(key)
        assert repr(key) in str(info.value)
        assert info.value.retryable  # STORAGE_UNAVAILABLE family


def test_object_over_max_bytes_is_content_invalid(store: ObjectStore) -> None:
    data = b"0123456789"
    put_bytes(store, "ten", data)
    assert store.get("ten", max_bytes=10) == data
    with pytest.raises(ContentInvalid, match="file over the maximum size") as info:
        store.get("ten", max_bytes=9)
    assert "10 bytes" in str(info.value)
    assert info.value.retryable is False


def test_digest_hashes_the_stored_bytes_in_pieces(store: ObjectStore) -> None:
    # more than one read piece; put with a sha256 that is not the bytes' would be refused, so
    # the object is written with its own hash and the digest must find the same
    data = os.urandom(2 * MiB + 17)
    store.put("app/report.bin", data, size=len(data), sha256=sha(data), content_type="x/y")
    assert store.digest("app/report.bin", max_bytes=len(data)) == ObjectInfo(
        "app/report.bin", len(data), sha(data), "x/y"
    )
    put_bytes(store, "empty", b"")
    assert store.digest("empty", max_bytes=0).sha256 == sha(b"")


def test_digest_over_max_bytes_and_of_a_missing_object(store: ObjectStore) -> None:
    put_bytes(store, "ten", b"0123456789")
    with pytest.raises(ContentInvalid, match="file over the maximum size"):
        store.digest("ten", max_bytes=9)
    with pytest.raises(ObjectNotFound):
        store.digest("absent", max_bytes=10)


def test_put_with_wrong_sha256_stores_nothing(store: ObjectStore) -> None:
    put_bytes(store, "kept", b"original")
    for key in ["kept", "new"]:
        with pytest.raises(ValueError, match="sha256"):
            store.put(key, b"payload", size=7, sha256=sha(b"other"), content_type=None)
    assert store.get("kept", max_bytes=100) == b"original"
    with pytest.raises(ObjectNotFound):
        store.stat("new")


def test_put_with_a_short_stream_stores_nothing(store: ObjectStore) -> None:
    with pytest.raises(ValueError, match="stream ended after 3 of 10 bytes"):
        store.put("short", io.BytesIO(b"abc"), size=10, sha256=sha(b"abc"), content_type=None)
    with pytest.raises(ObjectNotFound):
        store.stat("short")


def test_wrong_sha256_of_empty_object_is_rejected(store: ObjectStore) -> None:
    with pytest.raises(ValueError, match="sha256"):
        store.put("e", b"", size=0, sha256=sha(b"x"), content_type=None)


@pytest.mark.parametrize(
    "key", ["", "/abs", "../up", "a/../../up", "a//b", "a/./b", ".hidden", "a/.meta", "a\\b", "a/"]
)
def test_invalid_keys_are_rejected(store: ObjectStore, key: str) -> None:
    with pytest.raises(ValueError, match="invalid object key"):
        store.put(key, b"x", size=1, sha256=sha(b"x"), content_type=None)
    with pytest.raises(ValueError, match="invalid object key"):
        store.get(key, max_bytes=10)
    with pytest.raises(ValueError, match="invalid object key"):
        store.stat(key)


def test_ensure_ready_is_idempotent(store: ObjectStore) -> None:
    put_bytes(store, "k", b"v")
    store.ensure_ready()
    assert store.get("k", max_bytes=10) == b"v"


# --- a store that is down ---------------------------------------------------------------


def all_operations(store: ObjectStore) -> Iterator[Callable[[], object]]:
    yield store.ensure_ready
    yield lambda: store.stat("k")
    yield lambda: store.get("k", max_bytes=10)
    yield lambda: put_bytes(store, "k", b"v")
    yield lambda: store.delete("k")


def test_s3_server_down_is_storage_unavailable_within_seconds() -> None:
    down = open_store(f"s3://AK:{DOWN_SECRET}@127.0.0.1:{closed_port()}/docs?secure=false")
    for op in all_operations(down):
        start = time.monotonic()
        with pytest.raises(StorageUnavailable) as info:
            op()
        assert time.monotonic() - start < 5
        assert type(info.value) is StorageUnavailable  # not ObjectNotFound
        assert info.value.retryable
        assert "127.0.0.1" in str(info.value)
        assert_error_safe(DOWN_SECRET, info.value)


@pytest.mark.parametrize("broken", ["root-is-a-file", "root-missing"])
def test_folder_store_down_is_storage_unavailable(tmp_path: Path, broken: str) -> None:
    root = tmp_path / "blobs"
    store = FolderStore(root)
    store.ensure_ready()
    put_bytes(store, "k", b"v")
    for child in root.iterdir():
        child.unlink()
    root.rmdir()
    if broken == "root-is-a-file":
        root.write_bytes(b"not a folder")
    ops = list(all_operations(store))
    if broken == "root-missing":
        ops = ops[1:]  # ensure_ready would (rightly) create it
    for op in ops:
        with pytest.raises(StorageUnavailable) as info:
            op()
        assert type(info.value) is StorageUnavailable
        assert str(root) in str(info.value)


def _unreadable_root_is_storage_unavailable(folder: Path) -> None:
    root = folder / "blobs"
    store = FolderStore(root)
    store.ensure_ready()
    put_bytes(store, "k", b"v")
    root.chmod(0)
    try:
        for op in all_operations(store):
            with pytest.raises(StorageUnavailable) as info:
                op()
            assert type(info.value) is StorageUnavailable
    finally:
        root.chmod(0o700)


def _as_an_unprivileged_user(check: Callable[[Path], None], folder: Path) -> None:
    """Run ``check(folder)`` where file modes are enforced. Root (as in CI) reads any folder
    whatever its mode, so there the check runs in a forked child that first drops to the
    ``nobody`` user, in a folder that user owns."""
    if os.geteuid() != 0:
        check(folder)
        return
    nobody = pwd.getpwnam("nobody")
    folder = Path(tempfile.mkdtemp(prefix="trioindex-unprivileged-"))
    os.chown(folder, nobody.pw_uid, nobody.pw_gid)
    try:
        pid = os.fork()
        if pid == 0:  # the child never returns into pytest
            code = 1
            try:
                os.setgroups([])
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
                check(folder)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        deadline = time.monotonic() + 60
        while (status := os.waitpid(pid, os.WNOHANG))[0] == 0:
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail("the unprivileged check did not finish within 60 s")
            time.sleep(0.01)  # polling a child process for its exit, not waiting for a race
        assert os.waitstatus_to_exitcode(status[1]) == 0, "failed as nobody: see stderr"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_folder_store_unreadable_root_is_storage_unavailable(tmp_path: Path) -> None:
    _as_an_unprivileged_user(_unreadable_root_is_storage_unavailable, tmp_path)


# --- S3 specifics -----------------------------------------------------------------------


class RecordingPool(urllib3.PoolManager):
    """A real urllib3 pool that remembers the requests it sent."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.requests: list[tuple[str, str]] = []

    def urlopen(  # type: ignore[override]  # urllib3's own PoolManager override
        self, method: str, url: str, redirect: bool = True, **kw: Any
    ) -> urllib3.BaseHTTPResponse:
        self.requests.append((method, url))
        return super().urlopen(method, url, redirect=redirect, **kw)


def test_s3_over_max_bytes_never_downloads_the_object(s3_server: S3Server, s3_url: str) -> None:
    parsed = open_store(s3_url)
    assert isinstance(parsed, S3Store)
    pool = RecordingPool()
    store = S3Store(
        endpoint=s3_server.endpoint,
        bucket=parsed.bucket,
        access_key=s3_server.access_key,
        secret_key=s3_server.secret_key,
        secure=False,
        region="us-east-1",
        http_client=pool,
    )
    data = os.urandom(2 * MiB)
    put_bytes(store, "big", data)
    pool.requests.clear()
    with pytest.raises(ContentInvalid):
        store.get("big", max_bytes=MiB)
    assert [m for m, _ in pool.requests] == ["HEAD"]


def test_s3_digest_over_max_bytes_never_downloads_the_object(
    s3_server: S3Server, s3_url: str
) -> None:
    parsed = open_store(s3_url)
    assert isinstance(parsed, S3Store)
    pool = RecordingPool()
    store = S3Store(
        endpoint=s3_server.endpoint,
        bucket=parsed.bucket,
        access_key=s3_server.access_key,
        secret_key=s3_server.secret_key,
        secure=False,
        region="us-east-1",
        http_client=pool,
    )
    put_bytes(store, "big", os.urandom(2 * MiB))
    pool.requests.clear()
    with pytest.raises(ContentInvalid):
        store.digest("big", max_bytes=MiB)
    assert [m for m, _ in pool.requests] == ["HEAD"]


def test_s3_sha256_travels_as_object_metadata(s3_server: S3Server, s3_url: str) -> None:
    store = open_store(s3_url)
    assert isinstance(store, S3Store)
    put_bytes(store, "with-meta", b"abc")
    raw = s3_server.client().stat_object(store.bucket, "with-meta")
    assert raw.metadata is not None
    assert raw.metadata["x-amz-meta-sha256"] == sha(b"abc")
    # An object written by another tool has no hash: reported as unknown.
    s3_server.client().put_object(store.bucket, "foreign", io.BytesIO(b"xyz"), 3)
    assert store.stat("foreign") == ObjectInfo("foreign", 3, None, DEFAULT_CONTENT_TYPE)


def test_s3_ensure_ready_creates_a_missing_bucket(s3_server: S3Server) -> None:
    bucket = f"fresh-{os.urandom(6).hex()}"
    store = open_store(s3_server.url(bucket))
    with pytest.raises(StorageUnavailable):  # NoSuchBucket: not "object not found"
        put_bytes(store, "k", b"v")
    store.ensure_ready()
    assert s3_server.client().bucket_exists(bucket)
    store.ensure_ready()
    put_bytes(store, "k", b"v")
    assert store.get("k", max_bytes=10) == b"v"


def test_s3_credentials_stay_out_of_reprs_errors_and_logs(
    s3_server: S3Server, s3_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    store = open_store(s3_url)
    secret = s3_server.secret_key
    assert secret in s3_url
    assert_no_secret(secret, store, store.description)
    assert s3_server.access_key not in repr(store)
    assert store.description.startswith("s3 http://127.0.0.1:")
    put_bytes(store, "k", b"v")
    store.get("k", max_bytes=1)
    errors: list[BaseException] = []
    ops: list[Callable[[], object]] = [
        lambda: store.get("missing", max_bytes=1),
        lambda: store.get("k", max_bytes=0),
        lambda: open_store(s3_url.replace("secure=false", "secure=maybe")),
        lambda: open_store(s3_url + "&colour=blue"),
    ]
    for op in ops:
        with pytest.raises(Exception) as info:
            op()
        errors.append(info.value)
    assert [type(e) for e in errors] == [ObjectNotFound, ContentInvalid, ConfigError, ConfigError]
    for exc in errors:
        assert_error_safe(secret, exc)
    assert caplog.records, "expected client logging to check"
    assert secret not in caplog.text


# --- folder specifics -------------------------------------------------------------------


def test_folder_put_is_atomic_and_leaves_no_temp_files(tmp_path: Path) -> None:
    store = FolderStore(tmp_path / "blobs")
    store.ensure_ready()
    put_bytes(store, "a/b/c.txt", b"one")
    with pytest.raises(ValueError):
        store.put("a/b/c.txt", b"two", size=3, sha256=sha(b"xxx"), content_type=None)
    with pytest.raises(ValueError):
        store.put("a/b/c.txt", io.BytesIO(b"tw"), size=3, sha256=sha(b"two"), content_type=None)
    assert (tmp_path / "blobs/a/b/c.txt").read_bytes() == b"one"
    names = sorted(p.name for p in (tmp_path / "blobs/a/b").iterdir())
    assert names == [".c.txt.meta.json", "c.txt"]


def test_folder_get_reads_a_file_that_grew_after_its_size_was_taken(
    folder: FolderStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    put_bytes(folder, "grown", b"x" * 100)
    real = os.fstat

    class Smaller:
        """The file's status as it was before 90 bytes were appended."""

        def __init__(self, fd: int) -> None:
            self.st_size = real(fd).st_size - 90

    monkeypatch.setattr(os, "fstat", Smaller)
    assert folder.get("grown", max_bytes=1000) == b"x" * 100
    assert folder.get("grown", max_bytes=100) == b"x" * 100
    with pytest.raises(ContentInvalid, match="maximum size"):
        folder.get("grown", max_bytes=99)
    with pytest.raises(ContentInvalid, match="maximum size"):
        folder.get("grown", max_bytes=10)  # as large as the size first seen


class FsyncLog:
    """What ``os.fsync`` was called on (the system call the folder store's durability rests
    on), as (inode, is a directory), in order; the call itself still runs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.synced: list[tuple[int, bool]] = []
        real = os.fsync

        def logged(fd: int) -> None:
            st = os.fstat(fd)
            self.synced.append((st.st_ino, os.path.isdir(f"/proc/self/fd/{fd}")))
            real(fd)

        monkeypatch.setattr(os, "fsync", logged)

    def covers(self, *paths: Path) -> bool:
        return all((path.stat().st_ino, path.is_dir()) in self.synced for path in paths)


@pytest.fixture
def folder(tmp_path: Path) -> FolderStore:
    made = FolderStore(tmp_path / "blobs")
    made.ensure_ready()
    return made


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> FsyncLog:
    return FsyncLog(monkeypatch)


def test_folder_put_syncs_the_file_and_its_folder(folder: FolderStore, fsyncs: FsyncLog) -> None:
    put_bytes(folder, "a/one", b"one")
    assert fsyncs.covers(folder.root / "a/one", folder.root / "a")


def test_folder_deferred_sync_syncs_every_put_when_the_block_ends(
    folder: FolderStore, fsyncs: FsyncLog
) -> None:
    with folder.deferred_sync():
        put_bytes(folder, "a/one", b"one")
        put_bytes(folder, "b/two", b"two")
        with folder.deferred_sync():  # nested: the outer block syncs
            put_bytes(folder, "a/three", b"three")
        assert fsyncs.synced == []  # nothing waited for the disk yet
        assert folder.get("a/one", max_bytes=10) == b"one"  # but visible
    blobs = folder.root
    assert fsyncs.covers(blobs / "a/one", blobs / "b/two", blobs / "a/three")
    assert fsyncs.covers(blobs / "a", blobs / "b")
    assert len(fsyncs.synced) == 5  # each folder once
    # outside a block, puts sync as they go again
    put_bytes(folder, "c/four", b"four")
    assert fsyncs.covers(blobs / "c/four", blobs / "c")


def test_folder_deferred_sync_ending_in_an_error_syncs_nothing(
    folder: FolderStore, fsyncs: FsyncLog
) -> None:
    with pytest.raises(RuntimeError), folder.deferred_sync():
        put_bytes(folder, "a/one", b"one")
        raise RuntimeError("the caller gave up")
    assert fsyncs.synced == []
    # the block is over for this thread: the next put syncs itself
    put_bytes(folder, "a/two", b"two")
    assert fsyncs.covers(folder.root / "a/two")


def test_folder_deferred_sync_replacing_a_published_key_syncs_it_before_the_rename(
    folder: FolderStore, fsyncs: FsyncLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key that exists may be what committed versions point at (objects are shared by
    content): a deferred put over it must never leave the key naming bytes not yet on disk."""
    put_bytes(folder, "k", b"published")
    renamed_unsynced: list[str] = []
    real_replace = os.replace

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        published = Path(dst).exists() and not Path(dst).name.startswith(".")  # no sidecar
        if published and (os.stat(src).st_ino, False) not in fsyncs.synced:
            renamed_unsynced.append(Path(dst).name)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with folder.deferred_sync():
        put_bytes(folder, "k", b"published")  # a second document with the same bytes
        assert renamed_unsynced == []
        calls = len(fsyncs.synced)
        put_bytes(folder, "new", b"a new object: its fsync may wait")
        assert len(fsyncs.synced) == calls
    assert fsyncs.covers(folder.root / "k", folder.root / "new")


def _open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_folder_deferred_sync_leaves_no_file_open(folder: FolderStore) -> None:
    before = _open_files()
    with folder.deferred_sync():
        for i in range(5):
            put_bytes(folder, f"a/{i}", b"x" * i)
        assert _open_files() == before + 5  # synced at the end through the writing descriptors
    assert _open_files() == before
    with pytest.raises(RuntimeError), folder.deferred_sync():
        put_bytes(folder, "b/1", b"y")
        raise RuntimeError("the caller gave up")
    assert _open_files() == before


def test_folder_deferred_sync_is_per_thread(folder: FolderStore, fsyncs: FsyncLog) -> None:
    with folder.deferred_sync():
        other = threading.Thread(target=put_bytes, args=(folder, "x/other", b"other"))
        other.start()
        other.join()
        # another thread's put is outside this block: it synced before returning
        assert fsyncs.covers(folder.root / "x/other")


def test_folder_deferred_sync_reports_a_failed_sync_as_unavailable(
    folder: FolderStore, monkeypatch: pytest.MonkeyPatch
) -> None:

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    with pytest.raises(StorageUnavailable, match="cannot sync"), folder.deferred_sync():
        put_bytes(folder, "a/one", b"one")
        monkeypatch.setattr(os, "fsync", failing)


def _failing_directory_fsync(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    real = os.fsync

    def fsync(fd: int) -> None:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(code, os.strerror(code))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_folder_put_reports_a_failed_folder_fsync_and_ignores_an_unsupported_one(
    folder: FolderStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _failing_directory_fsync(monkeypatch, errno.EIO)
    with pytest.raises(StorageUnavailable, match="cannot write 'a/one'"):
        put_bytes(folder, "a/one", b"one")
    with pytest.raises(StorageUnavailable, match="cannot sync"), folder.deferred_sync():
        put_bytes(folder, "b/two", b"two")
    # a file system that cannot sync a directory at all: nothing to make durable there
    _failing_directory_fsync(monkeypatch, errno.EINVAL)
    put_bytes(folder, "c/three", b"three")
    with folder.deferred_sync():
        put_bytes(folder, "d/four", b"four")
    assert folder.get("d/four", max_bytes=10) == b"four"


def test_s3_put_is_durable_on_return_so_deferred_sync_changes_nothing(
    s3_server: S3Server, s3_url: str
) -> None:
    store = open_store(s3_url)
    store.ensure_ready()
    with store.deferred_sync():
        put_bytes(store, "a/one", b"one")
        assert store.get("a/one", max_bytes=10) == b"one"


def test_folder_get_of_a_huge_file_reads_nothing(tmp_path: Path) -> None:
    store = FolderStore(tmp_path / "blobs")
    store.ensure_ready()
    put_bytes(store, "huge", b"x")
    # Sparse: 64 GiB on paper, instant to create; reading it all would not finish.
    os.truncate(tmp_path / "blobs/huge", 64 * 1024 * MiB)
    start = time.monotonic()
    with pytest.raises(ContentInvalid, match="68719476736 bytes"):
        store.get("huge", max_bytes=MiB)
    assert time.monotonic() - start < 1


def test_folder_stat_recomputes_sha256_when_the_sidecar_is_stale(tmp_path: Path) -> None:
    store = FolderStore(tmp_path / "blobs")
    store.ensure_ready()
    put_bytes(store, "k", b"written by put")
    # As if a crash hit between a new file's rename and its sidecar: same size, new bytes.
    (tmp_path / "blobs/k").write_bytes(b"WRITTEN BY PUT")
    assert store.stat("k") == ObjectInfo("k", 14, sha(b"WRITTEN BY PUT"), None)
    (tmp_path / "blobs/.k.meta.json").unlink()
    assert store.stat("k").sha256 == sha(b"WRITTEN BY PUT")
    # the sidecar is not fsynced: after a crash it may be empty or cut short
    for lost in (b"", b'{"sha256": "' + sha(b"written by put")[:20].encode()):
        put_bytes(store, "k", b"written by put")
        (tmp_path / "blobs/.k.meta.json").write_bytes(lost)
        assert store.stat("k") == ObjectInfo("k", 14, sha(b"written by put"), None)


def test_folder_store_needs_an_absolute_root() -> None:
    with pytest.raises(ValueError, match="absolute"):
        FolderStore(Path("relative/blobs"))


def test_folder_ensure_ready_creates_nested_root(tmp_path: Path) -> None:
    store = FolderStore(tmp_path / "x" / "y" / "blobs")
    store.ensure_ready()
    assert (tmp_path / "x/y/blobs").is_dir()
    assert store.description == f"folder {tmp_path / 'x/y/blobs'}"


# --- URLs -------------------------------------------------------------------------------


def test_open_store_parses_s3_urls() -> None:
    store = open_store("s3://AK:s%2Fe%40c%3Ar@minio.internal:9000/docs?secure=false&region=eu-1")
    assert isinstance(store, S3Store)
    assert (store.endpoint, store.bucket, store.secure, store.region) == (
        "minio.internal:9000",
        "docs",
        False,
        "eu-1",
    )
    assert (store.access_key, store.secret_key) == ("AK", "s/e@c:r")
    assert store.description == "s3 http://minio.internal:9000 bucket docs"
    assert "s/e@c:r" not in repr(store)

    default = open_store("s3://AK:SK@s3.example.com/b")
    assert isinstance(default, S3Store)
    assert (default.secure, default.region, default.endpoint) == (True, None, "s3.example.com")

    anonymous = open_store("s3://[::1]:9000/b?secure=0")
    assert isinstance(anonymous, S3Store)
    assert (anonymous.endpoint, anonymous.access_key, anonymous.secure) == (
        "[::1]:9000",
        None,
        False,
    )


def test_open_store_parses_file_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(f"file://{tmp_path}/my%20blobs")
    assert isinstance(store, FolderStore)
    assert store.root == tmp_path / "my blobs"
    localhost = open_store(f"file://localhost{tmp_path}")
    assert isinstance(localhost, FolderStore)
    assert localhost.root == tmp_path
    monkeypatch.chdir(tmp_path)
    relative = open_store("file://.trioindex/blobs")
    assert isinstance(relative, FolderStore)
    assert relative.root == tmp_path / ".trioindex/blobs"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://AK:SECRETXYZ@host/b", "scheme"),
        ("s3://AK:SECRETXYZ@host", "bucket"),
        ("s3://AK:SECRETXYZ@host/b/extra", "bucket"),
        ("s3://AK:SECRETXYZ@host/b?secure=perhaps", "secure"),
        ("s3://AK:SECRETXYZ@host/b?acl=public", "unknown query"),
        ("s3://AK:SECRETXYZ@host:notaport/b", "not a valid URL"),
        ("s3://AK:SECRETXYZ@:9000/b", "host"),
        ("s3://AK@host/b", "both"),
        ("s3://AK:SECRETXYZ@host/b#frag", "fragment"),
        ("file://remote.example.com/x", "remote host"),
        ("file:relative", "path"),
        ("file:///x?y=1", "query"),
        ("/just/a/path", "scheme"),
    ],
)
def test_open_store_rejects_bad_urls_without_leaking_the_secret(url: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=r"storage\.url") as info:
        open_store(url)
    assert reason in str(info.value)
    assert "SECRETXYZ" not in "".join(traceback.format_exception(info.value))


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        (
            "s3://KEY:SECRET@host:9000/bucket?secure=false",
            "s3://KEY:***@host:9000/bucket?secure=false",
        ),
        ("s3://host:9000/bucket", "s3://host:9000/bucket"),
        ("s3://ONLYSECRET@host/b", "s3://***@host/b"),
        ("s3://KEY:se/cr@et@host/b", "s3://KEY:***@host/b"),
        ("file:///x/blobs", "file:///x/blobs"),
        ("postgresql://u:pw@db/x", "postgresql://u:***@db/x"),
    ],
)
def test_redact_url(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted


@given(secret=st.text(min_size=6))
def test_redact_url_never_shows_the_secret(secret: str) -> None:
    redacted = redact_url(f"s3://KEY:{secret}@host:9000/bucket?secure=false")
    assume(secret not in "s3://KEY:***@host:9000/bucket?secure=false")
    assert secret not in redacted


# --- the Trio facade --------------------------------------------------------------------


async def test_async_facade_round_trip(store: ObjectStore) -> None:
    astore = AsyncObjectStore(store, trio.CapacityLimiter(2))
    assert astore.description == store.description
    with trio.fail_after(20):
        await astore.ensure_ready()
        info = await astore.put(
            "a/k", io.BytesIO(b"data"), size=4, sha256=sha(b"data"), content_type=None
        )
        assert await astore.stat("a/k") == info
        assert await astore.get("a/k", max_bytes=4) == b"data"
        with pytest.raises(ObjectNotFound):
            await astore.get("nope", max_bytes=4)
        with pytest.raises(ContentInvalid):
            await astore.get("a/k", max_bytes=3)


async def test_async_facade_reports_a_down_server() -> None:
    down = open_store(f"s3://AK:{DOWN_SECRET}@127.0.0.1:{closed_port()}/docs?secure=false")
    astore = AsyncObjectStore(down, trio.CapacityLimiter(1))
    with trio.fail_after(10), pytest.raises(StorageUnavailable):
        await astore.stat("k")


class BlockingStore:
    """A store whose ``stat`` blocks its thread until released (facade mechanics only)."""

    description = "blocking test store"

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()
        self.finished = 0
        self.threads: set[int] = set()

    def stat(self, key: str) -> ObjectInfo:
        self.threads.add(threading.get_ident())
        self.entered.release()
        self.release.wait()
        self.finished += 1
        return ObjectInfo(key, 0, None, None)

    def put(
        self, key: str, data: bytes | BinaryIO, *, size: int, sha256: str, content_type: str | None
    ) -> ObjectInfo:
        raise NotImplementedError

    def get(self, key: str, *, max_bytes: int) -> bytes:
        raise NotImplementedError

    def ensure_ready(self) -> None:
        raise NotImplementedError

    def deferred_sync(self) -> contextlib.nullcontext[None]:
        raise NotImplementedError


async def test_async_facade_runs_in_threads_bounded_by_the_limiter() -> None:
    blocking = BlockingStore()
    limiter = trio.CapacityLimiter(1)
    astore = AsyncObjectStore(blocking, limiter)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(astore.stat, "a")
            nursery.start_soon(astore.stat, "b")
            await trio.to_thread.run_sync(blocking.entered.acquire)
            await trio.testing.wait_all_tasks_blocked()
            stats = limiter.statistics()
            assert (stats.borrowed_tokens, stats.tasks_waiting) == (1, 1)
            blocking.release.set()
    assert blocking.finished == 2
    assert threading.get_ident() not in blocking.threads


async def test_async_facade_cancellation_waits_for_the_thread() -> None:
    blocking = BlockingStore()
    astore = AsyncObjectStore(blocking, trio.CapacityLimiter(1))
    scope = trio.CancelScope()
    returned = trio.Event()
    finished_at_return: list[int] = []

    async def call() -> None:
        with scope:
            await astore.stat("k")
        finished_at_return.append(blocking.finished)
        returned.set()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await trio.to_thread.run_sync(blocking.entered.acquire)
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert not returned.is_set()  # not abandoned: still waiting for its thread
            blocking.release.set()
            await returned.wait()
    # The call returned only after its thread had finished (abandon_on_cancel=False).
    assert finished_at_return == [1]
