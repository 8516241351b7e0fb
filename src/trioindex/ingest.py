"""Enqueue: put a file in object storage, then create document, version and job in one transaction.

Objects are content-addressed (``sha256/ab/abcd…``), so uploading the same bytes twice stores
them once. The transaction locks the document row, so two ingests of the same key serialise
and version numbers stay dense; it ends with ``NOTIFY trioindex_jobs`` so idle workers wake at
once instead of at their next poll.
"""

from __future__ import annotations

import hashlib
import logging
import mimetypes
from collections.abc import Iterator, Sequence
from pathlib import Path
from uuid import UUID

import attrs
import trio

from trioindex.database import Connection, Database
from trioindex.lifecycle import record_event
from trioindex.storage import AsyncObjectStore

logger = logging.getLogger(__name__)

NOTIFY_CHANNEL = "trioindex_jobs"
_READ_CHUNK = 1 << 20


@attrs.frozen
class IngestResult:
    """What happened to one file. ``status`` is ``created`` or ``unchanged``."""

    path: str
    document_key: str
    status: str
    document_id: UUID
    version_id: UUID
    version_no: int
    job_id: UUID | None

    def as_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "document_key": self.document_key,
            "status": self.status,
            "document_id": str(self.document_id),
            "version_id": str(self.version_id),
            "version_no": self.version_no,
            "job_id": str(self.job_id) if self.job_id else None,
        }


@attrs.frozen
class SourceFile:
    path: Path
    document_key: str


def discover(paths: Sequence[Path]) -> list[SourceFile]:
    """Files named directly, and every regular file under folders (recursively, sorted).

    The document key is the path relative to the argument (for a file: its name). Hidden files
    and folders (``.git``, ``.DS_Store``) are skipped.
    """
    found: list[SourceFile] = []
    for root in paths:
        if root.is_dir():
            for path in sorted(_walk(root)):
                found.append(SourceFile(path, path.relative_to(root).as_posix()))
        elif root.is_file():
            found.append(SourceFile(root, root.name))
        else:
            raise FileNotFoundError(f"no such file or folder: {root}")
    return found


def _walk(root: Path) -> Iterator[Path]:
    for path in root.rglob("*"):
        relative = path.relative_to(root)
        if any(part.startswith(".") for part in relative.parts):
            continue
        if path.is_file():
            yield path


def storage_key_for(sha256: str) -> str:
    return f"sha256/{sha256[:2]}/{sha256}"


def file_digest(path: Path) -> tuple[str, int]:
    """SHA-256 (hex) and size of a file, read in 1 MiB pieces."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while block := handle.read(_READ_CHUNK):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size


def latest_version(conn: Connection, document_key: str) -> dict[str, object] | None:
    """The newest version of a document (with its job for any model), or None."""
    return conn.execute(
        """SELECT d.id AS document_id, v.id AS version_id, v.version_no, v.sha256
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


async def ingest_file(
    source: SourceFile,
    *,
    db: Database,
    store: AsyncObjectStore,
    model_id: UUID,
    max_attempts: int,
    priority: int = 0,
) -> IngestResult:
    """Upload one file (unless its bytes are already the latest version) and enqueue it."""
    sha256, size = await trio.to_thread.run_sync(file_digest, source.path)
    latest = await db.run(latest_version, source.document_key)
    storage_key = storage_key_for(sha256)
    content_type = mimetypes.guess_type(source.path.name)[0]
    if latest is None or latest["sha256"] != sha256:
        handle = await trio.to_thread.run_sync(source.path.open, "rb")
        with handle:
            await store.put(
                storage_key, handle, size=size, sha256=sha256, content_type=content_type
            )
    result = await db.run(
        enqueue_version,
        document_key=source.document_key,
        storage_key=storage_key,
        original_name=source.path.name,
        content_type=content_type,
        byte_size=size,
        sha256=sha256,
        model_id=model_id,
        max_attempts=max_attempts,
        priority=priority,
        path=str(source.path),
    )
    logger.info(
        "ingest %s: %s (document %s, version %d)",
        source.document_key,
        result.status,
        result.document_id,
        result.version_no,
    )
    return result


async def ingest_paths(
    paths: Sequence[Path],
    *,
    db: Database,
    store: AsyncObjectStore,
    model_id: UUID,
    max_attempts: int,
    priority: int = 0,
) -> list[IngestResult]:
    """Ingest every file under ``paths``, one after another, in a stable order."""
    sources = await trio.to_thread.run_sync(discover, list(paths))
    return [
        await ingest_file(
            source,
            db=db,
            store=store,
            model_id=model_id,
            max_attempts=max_attempts,
            priority=priority,
        )
        for source in sources
    ]
