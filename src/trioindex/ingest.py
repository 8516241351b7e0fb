"""Ingest: find the files, put each in object storage, then enqueue it in one transaction.

Owns
  * :func:`discover` — what a run covers: files named directly, and every visible file under the
    folders named, without ever leaving those folders through a symbolic link unless asked to;
  * :func:`ingest_file` — one file: read + hash once, upload (or restore a lost blob), enqueue;
  * :func:`enqueue_version` — document + version + job + ``NOTIFY`` in one transaction;
  * :func:`ingest_paths` — a whole run: one entry per file, and a file that cannot be ingested
    is reported (:class:`SkippedFile`) instead of ending the run.

Objects are content-addressed (``sha256/ab/abcd…``), so uploading the same bytes twice stores
them once, and every upload is verified against the hash it is stored under: a file that
changes while it is read is never stored under the wrong hash. The transaction locks the
document row, so two ingests of the same key serialise and version numbers stay dense; it ends
with ``NOTIFY trioindex_jobs`` so idle workers wake at once instead of at their next poll.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import mimetypes
import os
import stat
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO, Final
from uuid import UUID

import attrs
import trio

from trioindex import admin
from trioindex.db.jobs import record_event
from trioindex.db.pool import Connection, Database
from trioindex.errors import NotFound, ObjectNotFound, TrioindexError
from trioindex.storage import AsyncObjectStore

logger = logging.getLogger(__name__)

NOTIFY_CHANNEL = "trioindex_jobs"
MAX_KEY_CHARS: Final = 1024  # the CHECK on documents.external_key
_READ_CHUNK = 1 << 20
# O_NOFOLLOW: the path was resolved just before, so a link in its place now is a swap.
# O_NONBLOCK: a FIFO swapped in for the file must not hang the run (no effect on regular files).
_OPEN_FLAGS: Final = (
    os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | os.O_CLOEXEC
)


# --- results ---------------------------------------------------------------------------------


@attrs.frozen
class IngestResult:
    """What happened to one file: ``created``, ``unchanged`` or ``repaired``.

    ``repaired``: the bytes were already the latest version, but the store had lost its blob;
    the blob was uploaded again, and ``requeued`` says whether the version's FAILED job went
    back to the queue.
    """

    path: str
    document_key: str
    status: str
    document_id: UUID
    version_id: UUID
    version_no: int
    job_id: UUID | None
    requeued: bool = False

    def as_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "document_key": self.document_key,
            "status": self.status,
            "document_id": str(self.document_id),
            "version_id": str(self.version_id),
            "version_no": self.version_no,
            "job_id": str(self.job_id) if self.job_id else None,
            "requeued": self.requeued,
        }


@attrs.frozen
class SkippedFile:
    """A file (or folder) the run did not ingest, and why.

    ``status`` is ``skipped`` when a rule left it out (a symbolic link leading outside the
    folder, a folder already walked, something that is not a regular file) and ``error`` when
    it could not be ingested (a name that is not UTF-8, unreadable, changed while being read);
    the CLI exits non-zero when any entry is an ``error``. ``path`` is printable (bytes that
    are not UTF-8 are shown as ``\\xff``); ``document_key`` is None when the name is no valid
    key. Never carries file contents.
    """

    path: str
    document_key: str | None
    status: str
    reason: str

    def as_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "document_key": self.document_key,
            "status": self.status,
            "reason": self.reason,
        }


IngestEntry = IngestResult | SkippedFile


class FileNotIngested(TrioindexError):
    """One file could not be ingested; ``ingest_paths`` reports it and goes on."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class FileChanged(FileNotIngested):
    """The bytes read for the upload are not the bytes that were hashed."""

    def __init__(self) -> None:
        super().__init__("the file changed while it was being read")


def printable(path: Path | str) -> str:
    """``path`` as text that can always be printed: undecodable bytes become ``\\xNN``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _is_text(name: str) -> bool:
    # Undecodable bytes in a file name arrive as lone surrogates (surrogateescape), which
    # PostgreSQL text cannot hold.
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# --- discovery ---------------------------------------------------------------------------------


@attrs.frozen
class SourceFile:
    """A file to ingest. ``inside``: the resolved folder it must still be in when it is opened
    (None for a file named directly, or with ``follow_symlinks``)."""

    path: Path
    document_key: str
    inside: Path | None = None


@attrs.frozen
class Discovery:
    """Everything a run covers, in a stable order: files and the entries left out."""

    entries: list[SourceFile | SkippedFile]

    @property
    def files(self) -> list[SourceFile]:
        return [e for e in self.entries if isinstance(e, SourceFile)]

    @property
    def skipped(self) -> list[SkippedFile]:
        return [e for e in self.entries if isinstance(e, SkippedFile)]


def discover(paths: Sequence[Path], *, follow_symlinks: bool = False) -> Discovery:
    """Files named directly, and every regular file under folders (recursively, sorted by key).

    The document key is the path relative to the argument (for a file: its name). Hidden files
    and folders (``.git``, ``.DS_Store``) are left out. A symbolic link inside a folder is
    followed only when its target is inside that folder, unless ``follow_symlinks``; every
    folder is walked at most once, so links cannot make the walk loop. Paths named directly are
    always followed. A missing argument raises ``FileNotFoundError``; anything wrong with one
    entry of a folder becomes a :class:`SkippedFile`.
    """
    entries: list[SourceFile | SkippedFile] = []
    for root in paths:
        if root.is_dir():
            entries.extend(_FolderWalk(root, follow_symlinks).run())
        elif root.is_file():
            entries.append(_file_entry(root, root.name, None))
        else:
            raise FileNotFoundError(f"no such file or folder: {printable(root)}")
    return Discovery(entries)


def _file_entry(path: Path, key: str, inside: Path | None) -> SourceFile | SkippedFile:
    if not _is_text(key):
        return _error(path, None, "file name is not valid UTF-8; rename it to ingest it")
    if len(key) > MAX_KEY_CHARS:
        return _error(path, None, f"document key longer than {MAX_KEY_CHARS} characters")
    return SourceFile(path, key, inside)


def _error(path: Path, key: str | None, reason: str) -> SkippedFile:
    return SkippedFile(printable(path), key if key and _is_text(key) else None, "error", reason)


def _skipped(path: Path, key: str, reason: str) -> SkippedFile:
    return SkippedFile(printable(path), key if _is_text(key) else None, "skipped", reason)


@attrs.frozen
class _Folder:
    path: Path  # as the user will see it (under the argument)
    key: str  # key prefix of its files: "" or "sub/"
    real: Path  # resolved, where it is read from


def _identity(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


@attrs.define
class _FolderWalk:
    """Walks one folder argument.

    Real sub-folders are walked first and links to folders only afterwards, so each folder is
    walked once, under its own name when it has one, and a link to a folder already walked (a
    loop, or a second name) is reported instead of walked again.
    """

    root: Path
    follow_symlinks: bool
    real_root: Path = attrs.field(init=False)
    found: list[tuple[list[str], SourceFile | SkippedFile]] = attrs.Factory(list)
    walked: dict[tuple[int, int], str] = attrs.Factory(dict)  # folder identity → key shown
    folders: deque[_Folder] = attrs.Factory(deque)
    linked: deque[_Folder] = attrs.Factory(deque)

    def __attrs_post_init__(self) -> None:
        self.real_root = Path(os.path.realpath(self.root))

    def run(self) -> list[SourceFile | SkippedFile]:
        self.walked[_identity(self.real_root)] = ""
        self.folders.append(_Folder(self.root, "", self.real_root))
        while self.folders or self.linked:
            if self.folders:
                self._scan(self.folders.popleft())
            else:
                self._enter_link(self.linked.popleft())
        self.found.sort(key=lambda item: item[0])
        return [entry for _, entry in self.found]

    def _add(self, key: str, entry: SourceFile | SkippedFile) -> None:
        self.found.append((key.split("/"), entry))

    def _enter_link(self, link: _Folder) -> None:
        key = link.key.rstrip("/")
        try:
            identity = _identity(link.real)
        except OSError as exc:
            self._add(key, _error(link.path, key, f"cannot read folder: {exc.strerror}"))
            return
        if identity in self.walked:
            where = self.walked[identity]
            reason = (
                f"symbolic link to a folder already walked as {where!r}"
                if where
                else "symbolic link back to the folder being ingested, already walked (a loop)"
            )
            self._add(key, _skipped(link.path, key, reason))
            return
        self.walked[identity] = key
        self._scan(link)

    def _scan(self, folder: _Folder) -> None:
        try:
            with os.scandir(folder.real) as listing:
                children = sorted(listing, key=lambda entry: entry.name)
        except OSError as exc:
            key = folder.key.rstrip("/") or "."
            self._add(key, _error(folder.path, None, f"cannot read folder: {exc.strerror}"))
            return
        for child in children:
            if child.name.startswith("."):
                continue
            path, key = folder.path / child.name, folder.key + child.name
            try:
                self._child(child, path, key)
            except OSError as exc:  # vanished or unreadable while we looked
                self._add(key, _error(path, key, f"cannot read: {exc.strerror}"))

    def _child(self, child: os.DirEntry[str], path: Path, key: str) -> None:
        if child.is_symlink():
            self._link(Path(child.path), path, key)
        elif child.is_dir(follow_symlinks=False):
            self._subfolder(_Folder(path, key + "/", Path(child.path)))
        elif child.is_file(follow_symlinks=False):
            self._add(key, _file_entry(path, key, self._inside))
        else:
            self._add(key, _skipped(path, key, "not a regular file"))

    @property
    def _inside(self) -> Path | None:
        return None if self.follow_symlinks else self.real_root

    def _subfolder(self, folder: _Folder) -> None:
        if not _is_text(folder.key):
            reason = "folder name is not valid UTF-8; none of its files were ingested"
            self._add(folder.key.rstrip("/"), _error(folder.path, None, reason))
            return
        self.walked[_identity(folder.real)] = folder.key.rstrip("/")
        self.folders.append(folder)

    def _link(self, link: Path, path: Path, key: str) -> None:
        target = Path(os.path.realpath(link))
        try:
            st = os.stat(target)
        except OSError as exc:
            self._add(key, _error(path, key, f"broken symbolic link ({exc.strerror})"))
            return
        kind = "folder" if stat.S_ISDIR(st.st_mode) else "file"
        if not self.follow_symlinks and not target.is_relative_to(self.real_root):
            reason = (
                f"symbolic link to a {kind} outside the folder ({printable(target)}); "
                "use --follow-symlinks to ingest it"
            )
            self._add(key, _skipped(path, key, reason))
        elif stat.S_ISDIR(st.st_mode):
            if _is_text(key):
                self.linked.append(_Folder(path, key + "/", target))
            else:
                reason = "folder name is not valid UTF-8; none of its files were ingested"
                self._add(key, _error(path, None, reason))
        elif stat.S_ISREG(st.st_mode):
            self._add(key, _file_entry(path, key, self._inside))
        else:
            self._add(key, _skipped(path, key, "symbolic link to something not a regular file"))


# --- reading -----------------------------------------------------------------------------------


def storage_key_for(sha256: str) -> str:
    return f"sha256/{sha256[:2]}/{sha256}"


def open_source(source: SourceFile) -> BinaryIO:
    """Open the file for reading, re-checking what discovery checked (it may have changed)."""
    real = Path(os.path.realpath(source.path))
    if source.inside is not None and not real.is_relative_to(source.inside):
        raise FileNotIngested("symbolic link now leads outside the folder; not ingested")
    try:
        fd = os.open(real, _OPEN_FLAGS)
    except OSError as exc:
        raise FileNotIngested(f"cannot open: {exc.strerror}") from None
    handle = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        handle.close()
        raise FileNotIngested("no longer a regular file; not ingested")
    return handle


def digest(handle: BinaryIO) -> tuple[str, int]:
    """SHA-256 (hex) and size of what ``handle`` reads from its start, in 1 MiB pieces."""
    sha = hashlib.sha256()
    size = 0
    handle.seek(0)
    try:
        while block := handle.read(_READ_CHUNK):
            sha.update(block)
            size += len(block)
    except OSError as exc:
        raise FileNotIngested(f"cannot read: {exc.strerror}") from None
    return sha.hexdigest(), size


# --- the database side -------------------------------------------------------------------------


def latest_version(conn: Connection, document_key: str) -> dict[str, object] | None:
    """The newest version of a document (id, number, sha256, storage key), or None."""
    return conn.execute(
        """SELECT d.id AS document_id, v.id AS version_id, v.version_no, v.sha256, v.storage_key
           FROM documents d JOIN document_versions v ON v.document_id = d.id
           WHERE d.external_key = %s ORDER BY v.version_no DESC LIMIT 1""",
        (document_key,),
    ).fetchone()


def enqueue_version(
    conn: Connection,
    *,
    document_key: str,
    storage_key: str,
    original_name: str,
    content_type: str | None,
    byte_size: int,
    sha256: str,
    model_id: UUID,
    max_attempts: int,
    priority: int = 0,
    path: str = "",
) -> IngestResult:
    """Document (if new) + version UPLOADED + job PENDING + NOTIFY, in one transaction.

    If the document's latest version has the same bytes, nothing is created and the existing
    version is returned as ``unchanged``.
    """
    with conn.transaction():
        conn.execute(
            """INSERT INTO documents (external_key) VALUES (%s)
               ON CONFLICT (external_key) DO NOTHING""",
            (document_key,),
        )
        document = conn.execute(
            "SELECT id FROM documents WHERE external_key = %s FOR UPDATE", (document_key,)
        ).fetchone()
        assert document is not None
        document_id: UUID = document["id"]
        latest = conn.execute(
            """SELECT v.id, v.version_no, v.sha256, j.id AS job_id
               FROM document_versions v
               LEFT JOIN embedding_jobs j
                 ON j.document_version_id = v.id AND j.embedding_model_id = %s
               WHERE v.document_id = %s ORDER BY v.version_no DESC LIMIT 1""",
            (model_id, document_id),
        ).fetchone()
        if latest is not None and latest["sha256"] == sha256:
            return IngestResult(
                path,
                document_key,
                "unchanged",
                document_id,
                latest["id"],
                latest["version_no"],
                latest["job_id"],
            )
        version_no = 1 if latest is None else latest["version_no"] + 1
        version = conn.execute(
            """INSERT INTO document_versions
                   (document_id, version_no, storage_key, original_name, content_type,
                    byte_size, sha256)
               VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id""",
            (document_id, version_no, storage_key, original_name, content_type, byte_size, sha256),
        ).fetchone()
        assert version is not None
        job = conn.execute(
            """INSERT INTO embedding_jobs
                   (document_version_id, embedding_model_id, max_attempts, priority)
               VALUES (%s, %s, %s, %s) RETURNING id""",
            (version["id"], model_id, max_attempts, priority),
        ).fetchone()
        assert job is not None
        record_event(
            conn,
            "JOB_ENQUEUED",
            job_id=job["id"],
            version_id=version["id"],
            detail={"version_no": version_no, "byte_size": byte_size},
        )
        conn.execute(f"NOTIFY {NOTIFY_CHANNEL}")
    return IngestResult(
        path, document_key, "created", document_id, version["id"], version_no, job["id"]
    )


def requeue_failed_job(conn: Connection, job_id: UUID, *, extra_attempts: int) -> bool:
    """Put a FAILED job back to PENDING with a fresh budget (``jobs retry``'s own transaction,
    event and NOTIFY); False, changing nothing, when the job is not FAILED."""
    try:
        admin.retry_failed_job(conn, job_id, extra_attempts=extra_attempts)
    except NotFound:
        return False
    return True


# --- one file ----------------------------------------------------------------------------------


async def ingest_file(
    source: SourceFile,
    *,
    db: Database,
    store: AsyncObjectStore,
    model_id: UUID,
    max_attempts: int,
    priority: int = 0,
) -> IngestResult:
    """Upload one file (unless its bytes are already the latest version) and enqueue it.

    A file that changes between hashing and upload is read again from the start once; a second
    change, or a file that cannot be read, raises :class:`FileNotIngested`. Storage and database
    errors propagate (they are not about this file).
    """
    ingest = functools.partial(
        _ingest_once,
        source,
        db=db,
        store=store,
        model_id=model_id,
        max_attempts=max_attempts,
        priority=priority,
    )
    try:
        result = await ingest()
    except FileChanged:
        logger.info("ingest %s: changed while being read; reading it again", source.document_key)
        try:
            result = await ingest()
        except FileChanged:
            raise FileNotIngested(
                "the file changed while it was being read, twice; not ingested "
                "(ingest it again once it stops changing)"
            ) from None
    logger.info(
        "ingest %s: %s (document %s, version %d)",
        source.document_key,
        result.status,
        result.document_id,
        result.version_no,
    )
    return result


async def _ingest_once(
    source: SourceFile,
    *,
    db: Database,
    store: AsyncObjectStore,
    model_id: UUID,
    max_attempts: int,
    priority: int,
) -> IngestResult:
    # One open file for hashing and upload: the bytes uploaded are those of the same inode, and
    # the store checks them against the hash before anything becomes visible.
    handle = await trio.to_thread.run_sync(open_source, source)
    with handle:
        sha256, size = await trio.to_thread.run_sync(digest, handle)
        content_type = mimetypes.guess_type(source.path.name)[0]
        upload = functools.partial(
            _upload, store, handle, size=size, sha256=sha256, content_type=content_type
        )
        latest = await db.run(latest_version, source.document_key)
        restored = False
        if latest is None or latest["sha256"] != sha256:
            await upload(storage_key_for(sha256))
        elif not await _blob_intact(store, str(latest["storage_key"]), sha256, size):
            logger.warning(
                "ingest %s: version %s lost its stored copy in %s; uploading it again",
                source.document_key,
                latest["version_no"],
                store.description,
            )
            await upload(str(latest["storage_key"]))
            restored = True
    result = await db.run(
        enqueue_version,
        document_key=source.document_key,
        storage_key=storage_key_for(sha256),
        original_name=source.path.name,
        content_type=content_type,
        byte_size=size,
        sha256=sha256,
        model_id=model_id,
        max_attempts=max_attempts,
        priority=priority,
        path=printable(source.path),
    )
    if restored and result.status == "unchanged":
        requeued = result.job_id is not None and await db.run(
            requeue_failed_job, result.job_id, extra_attempts=max_attempts
        )
        result = attrs.evolve(result, status="repaired", requeued=requeued)
    return result


async def _upload(
    store: AsyncObjectStore,
    handle: BinaryIO,
    key: str,
    *,
    size: int,
    sha256: str,
    content_type: str | None,
) -> None:
    await trio.to_thread.run_sync(handle.seek, 0)
    try:
        await store.put(key, handle, size=size, sha256=sha256, content_type=content_type)
    except ValueError:
        # the store read other bytes (or fewer) than were hashed: nothing was stored
        raise FileChanged() from None


async def _blob_intact(store: AsyncObjectStore, key: str, sha256: str, size: int) -> bool:
    """One stat: is the version's blob in the store, with its size and (when known) hash?"""
    try:
        info = await store.stat(key)
    except ObjectNotFound:
        return False
    return info.size == size and info.sha256 in (None, sha256)


# --- a run -------------------------------------------------------------------------------------


async def ingest_paths(
    paths: Sequence[Path],
    *,
    db: Database,
    store: AsyncObjectStore,
    model_id: UUID,
    max_attempts: int,
    priority: int = 0,
    follow_symlinks: bool = False,
) -> list[IngestEntry]:
    """Ingest every file under ``paths``, one after another; one entry per file, in a stable order.

    A file that cannot be ingested becomes an ``error`` :class:`SkippedFile` and the run goes
    on; entries left out by a rule are ``skipped``. A storage or database outage still ends
    the run (every later file would fail the same way, and a re-run is safe).
    """
    found = await trio.to_thread.run_sync(
        functools.partial(discover, list(paths), follow_symlinks=follow_symlinks)
    )
    entries: list[IngestEntry] = []
    for item in found.entries:
        entry: IngestEntry = (
            item
            if isinstance(item, SkippedFile)
            else await _ingest_or_report(
                item,
                db=db,
                store=store,
                model_id=model_id,
                max_attempts=max_attempts,
                priority=priority,
            )
        )
        if isinstance(entry, SkippedFile):
            logger.info(
                "ingest %s: %s (%s)", entry.document_key or entry.path, entry.status, entry.reason
            )
        entries.append(entry)
    return entries


async def _ingest_or_report(
    source: SourceFile,
    *,
    db: Database,
    store: AsyncObjectStore,
    model_id: UUID,
    max_attempts: int,
    priority: int,
) -> IngestEntry:
    try:
        return await ingest_file(
            source,
            db=db,
            store=store,
            model_id=model_id,
            max_attempts=max_attempts,
            priority=priority,
        )
    except FileNotIngested as exc:
        return SkippedFile(printable(source.path), source.document_key, "error", exc.reason)
