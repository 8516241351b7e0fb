"""Documents for operators: a page of them in key order (each with its newest version), one
with every version, how many a key prefix matches, and each model's job and served version
for every version shown."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import attrs

from trioindex.db.pool import Connection
from trioindex.errors import NotFound
from trioindex.values import JobStatus

_VERSION_COLUMNS = """v.id AS version_id, v.version_no, v.byte_size, v.sha256, v.content_type,
                      v.original_name, v.created_at AS version_created_at,
                      v.ocr_low_confidence_pages"""

# one row per job of the versions asked for: the job's model, and the version that model serves
_MODEL_STATES = """
SELECT j.document_version_id, j.id AS job_id, j.status, j.progress, j.chunk_count,
       j.last_failure_type, m.name AS model, m.is_active, sv.version_no AS served_version_no
FROM embedding_jobs j
JOIN document_versions v ON v.id = j.document_version_id
JOIN embedding_models m ON m.id = j.embedding_model_id
LEFT JOIN served_versions s ON s.document_id = v.document_id AND s.embedding_model_id = m.id
LEFT JOIN document_versions sv ON sv.id = s.document_version_id
"""


@attrs.frozen
class ModelState:
    """One model's state of one version: its job there (status, progress, the chunks it indexed,
    its failure type) and which version of the document that model serves now
    (``served_version_no``; None before it completed any)."""

    model: str
    serves_search: bool
    job_id: UUID
    job_status: JobStatus
    progress: int
    chunk_count: int | None
    failure_type: str | None
    served_version_no: int | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ModelState:
        return cls(
            row["model"],
            row["is_active"],
            row["job_id"],
            JobStatus(row["status"]),
            row["progress"],
            row["chunk_count"],
            row["last_failure_type"],
            row["served_version_no"],
        )


@attrs.frozen
class VersionView:
    """One version of a document (its bytes' facts) with every model's job for it, and the
    pages OCR read with low confidence (``low_confidence_pages``, in order; empty unless its
    text came from OCR and some page was under ``indexing.parsing.ocr-low-confidence``)."""

    version_no: int
    byte_size: int
    sha256: str
    content_type: str | None
    original_name: str
    created_at: datetime
    models: tuple[ModelState, ...]
    low_confidence_pages: tuple[int, ...] = ()

    @property
    def low_confidence(self) -> bool:
        """Whether OCR marked this version for a person to check."""
        return bool(self.low_confidence_pages)


@attrs.frozen
class DocumentView:
    """A document: its key, how many versions it has, and ``versions`` — the newest one in a
    listing (:func:`list_documents`), every one, oldest first, for :func:`show_document`."""

    key: str
    id: UUID
    created_at: datetime
    version_count: int
    versions: tuple[VersionView, ...]


@attrs.frozen
class DocumentPage:
    """Documents in key order; ``next_after`` is the key to pass as ``after`` for the next
    page (None on the last one)."""

    documents: tuple[DocumentView, ...]
    next_after: str | None


def _model_states(
    conn: Connection, where: str, param: object
) -> dict[UUID, tuple[ModelState, ...]]:
    rows = conn.execute(
        f"{_MODEL_STATES} WHERE {where} ORDER BY m.is_active DESC, m.name", (param,)
    ).fetchall()
    states: dict[UUID, list[ModelState]] = {}
    for row in rows:
        states.setdefault(row["document_version_id"], []).append(ModelState.from_row(row))
    return {version: tuple(found) for version, found in states.items()}


def _version(row: dict[str, Any], states: dict[UUID, tuple[ModelState, ...]]) -> VersionView:
    return VersionView(
        row["version_no"],
        row["byte_size"],
        row["sha256"],
        row["content_type"],
        row["original_name"],
        row["version_created_at"],
        states.get(row["version_id"], ()),
        tuple(row["ocr_low_confidence_pages"] or ()),
    )


def list_documents(
    conn: Connection,
    *,
    prefix: str = "",
    after: str | None = None,
    limit: int = 100,
    low_confidence: bool | None = None,
) -> DocumentPage:
    """Documents whose key starts with ``prefix``, after the key ``after``, in key order, at
    most ``limit``: each with its newest version and every model's state of it. One snapshot
    (a repeatable-read transaction), so a page never mixes two moments. ``low_confidence``
    True lists only the documents whose newest version OCR marked as of low confidence, False
    only the others."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        rows = conn.execute(
            f"""SELECT d.id, d.external_key, d.created_at, {_VERSION_COLUMNS},
                       (SELECT count(*) FROM document_versions c WHERE c.document_id = d.id)
                         AS version_count
                FROM documents d
                JOIN LATERAL (SELECT * FROM document_versions x WHERE x.document_id = d.id
                              ORDER BY x.version_no DESC LIMIT 1) v ON true
                WHERE starts_with(d.external_key, %(prefix)s)
                  AND (%(after)s::text IS NULL OR d.external_key > %(after)s)
                  AND (%(low)s::boolean IS NULL
                       OR (v.ocr_low_confidence_pages IS NOT NULL) = %(low)s)
                ORDER BY d.external_key LIMIT %(limit)s""",
            {"prefix": prefix, "after": after, "limit": limit + 1, "low": low_confidence},
        ).fetchall()
        page = rows[:limit]
        states = _model_states(conn, "v.id = ANY(%s)", [row["version_id"] for row in page])
    documents = tuple(
        DocumentView(
            row["external_key"],
            row["id"],
            row["created_at"],
            row["version_count"],
            (_version(row, states),),
        )
        for row in page
    )
    more = len(rows) > limit
    return DocumentPage(documents, documents[-1].key if more and documents else None)


def count_documents(conn: Connection, *, prefix: str = "") -> int:
    """How many documents have a key starting with ``prefix`` (all for "")."""
    row = conn.execute(
        "SELECT count(*) AS n FROM documents WHERE starts_with(external_key, %s)", (prefix,)
    ).fetchone()
    return int(row["n"]) if row else 0


def show_document(conn: Connection, key: str) -> DocumentView:
    """One document with every version, oldest first, and every model's job for each;
    :class:`NotFound` when no document has that key."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        document = conn.execute(
            "SELECT id, external_key, created_at FROM documents WHERE external_key = %s", (key,)
        ).fetchone()
        if document is None:
            raise NotFound(f"no document with key {key!r}")
        rows = conn.execute(
            f"""SELECT {_VERSION_COLUMNS} FROM document_versions v
                WHERE v.document_id = %s ORDER BY v.version_no""",
            (document["id"],),
        ).fetchall()
        states = _model_states(conn, "v.document_id = %s", document["id"])
    versions: Sequence[VersionView] = [_version(row, states) for row in rows]
    return DocumentView(key, document["id"], document["created_at"], len(versions), tuple(versions))
