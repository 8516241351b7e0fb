"""The database side of ingest: document + version + job + ``NOTIFY``, many files per transaction.

Each file's document row is locked, so two ingests of the same key serialise and version
numbers stay dense; the transaction ends with ``NOTIFY trioindex_jobs`` so idle workers wake at
once instead of at their next poll. Bytes equal to the latest version create nothing
(``unchanged``). A run enqueues its files in groups (:func:`enqueue_versions`): one transaction
and one WAL flush for a few hundred files instead of one each, with every file's outcome the
same as if it had been enqueued alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

import attrs

from trioindex.db.events import record_events
from trioindex.db.operations import retry_failed_job
from trioindex.db.pool import Connection
from trioindex.errors import NotFound
from trioindex.ingest.results import IngestResult

__all__ = [
    "NOTIFY_CHANNEL",
    "NewVersion",
    "enqueue_version",
    "enqueue_versions",
    "latest_version",
    "latest_versions",
    "requeue_failed_job",
]

NOTIFY_CHANNEL = "trioindex_jobs"


@attrs.frozen
class NewVersion:
    """One uploaded file to enqueue: its document key and the stored blob's facts."""

    document_key: str
    storage_key: str
    original_name: str
    content_type: str | None
    byte_size: int
    sha256: str
    path: str = ""  # as reported (printable), never read


def latest_version(conn: Connection, document_key: str) -> dict[str, object] | None:
    """The newest version of a document (id, number, sha256, storage key), or None."""
    return latest_versions(conn, [document_key]).get(document_key)


def latest_versions(conn: Connection, document_keys: Sequence[str]) -> dict[str, dict[str, object]]:
    """:func:`latest_version` of many documents in one query, by key (absent: no document)."""
    rows = conn.execute(
        """SELECT DISTINCT ON (d.external_key) d.external_key, d.id AS document_id,
                  v.id AS version_id, v.version_no, v.sha256, v.storage_key
           FROM documents d JOIN document_versions v ON v.document_id = d.id
           WHERE d.external_key = ANY(%s) ORDER BY d.external_key, v.version_no DESC""",
        (list(document_keys),),
    ).fetchall()
    return {row.pop("external_key"): row for row in rows}


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
    version = NewVersion(
        document_key, storage_key, original_name, content_type, byte_size, sha256, path
    )
    (result,) = enqueue_versions(
        conn, [version], model_id=model_id, max_attempts=max_attempts, priority=priority
    )
    return result


def enqueue_versions(
    conn: Connection,
    versions: Sequence[NewVersion],
    *,
    model_id: UUID,
    max_attempts: int,
    priority: int = 0,
) -> list[IngestResult]:
    """:func:`enqueue_version` for each of ``versions``, all in one transaction with one
    ``NOTIFY`` (when a job was created); results in the order given.

    Set-based: a handful of statements for the whole group, whatever its size. Document rows
    are locked in key order, so two runs over overlapping keys wait for each other instead of
    deadlocking. The same key twice becomes two versions in that order (the second
    ``unchanged`` when its bytes are the first's).
    """
    if not versions:
        return []
    keys = sorted({v.document_key for v in versions})
    with conn.transaction():
        conn.execute(
            """INSERT INTO documents (external_key)
               SELECT k FROM unnest(%s::text[]) AS k ORDER BY k
               ON CONFLICT (external_key) DO NOTHING""",
            (keys,),
        )
        document_ids: dict[str, UUID] = {
            row["external_key"]: row["id"]
            for row in conn.execute(
                """SELECT id, external_key FROM documents WHERE external_key = ANY(%s)
                   ORDER BY external_key FOR UPDATE""",
                (keys,),
            )
        }
        latest = {
            row["document_id"]: _Latest(row["sha256"], row["version_no"], row["id"], row["job_id"])
            for row in conn.execute(
                """SELECT DISTINCT ON (v.document_id) v.document_id, v.id, v.version_no,
                          v.sha256, j.id AS job_id
                   FROM document_versions v
                   LEFT JOIN embedding_jobs j
                     ON j.document_version_id = v.id AND j.embedding_model_id = %s
                   WHERE v.document_id = ANY(%s)
                   ORDER BY v.document_id, v.version_no DESC""",
                (model_id, list(document_ids.values())),
            )
        }
        # each file against its document's latest version, in the order given (a key given
        # twice compares with the version its first file makes)
        outcome: list[_Latest] = []
        created: list[tuple[NewVersion, UUID, _Latest]] = []
        for new in versions:
            document_id = document_ids[new.document_key]
            before = latest.get(document_id)
            if before is None or before.sha256 != new.sha256:
                before = latest[document_id] = _Latest(
                    new.sha256, 1 if before is None else before.version_no + 1, created=True
                )
                created.append((new, document_id, before))
            outcome.append(before)
        _insert_versions(conn, created, model_id, max_attempts, priority)
        if created:
            conn.execute(f"NOTIFY {NOTIFY_CHANNEL}")
    results: list[IngestResult] = []
    used: set[int] = set()
    for new, state in zip(versions, outcome, strict=True):
        assert state.version_id is not None
        # a version made here is "created" for the file that made it (its first user)
        status = "created" if state.created and id(state) not in used else "unchanged"
        used.add(id(state))
        results.append(
            IngestResult(
                new.path,
                new.document_key,
                status,
                document_ids[new.document_key],
                state.version_id,
                state.version_no,
                state.job_id,
            )
        )
    return results


@attrs.define
class _Latest:
    """A document's newest version as the group is decided; one made by this group
    (``created``) gets its ids once inserted."""

    sha256: str
    version_no: int
    version_id: UUID | None = None
    job_id: UUID | None = None
    created: bool = False


def _insert_versions(
    conn: Connection,
    created: Sequence[tuple[NewVersion, UUID, _Latest]],
    model_id: UUID,
    max_attempts: int,
    priority: int,
) -> None:
    """The new versions (UPLOADED), one PENDING job each and its ``JOB_ENQUEUED`` event: three
    statements; fills in each :class:`_Latest`'s ids."""
    if not created:
        return
    rows = conn.execute(
        """INSERT INTO document_versions
               (document_id, version_no, storage_key, original_name, content_type, byte_size,
                sha256)
           SELECT * FROM unnest(%s::uuid[], %s::integer[], %s::text[], %s::text[], %s::text[],
                                %s::bigint[], %s::text[])
           RETURNING id, document_id, version_no""",
        (
            [document_id for _, document_id, _ in created],
            [state.version_no for _, _, state in created],
            [new.storage_key for new, _, _ in created],
            [new.original_name for new, _, _ in created],
            [new.content_type for new, _, _ in created],
            [new.byte_size for new, _, _ in created],
            [new.sha256 for new, _, _ in created],
        ),
    ).fetchall()
    version_ids = {(row["document_id"], row["version_no"]): row["id"] for row in rows}
    for _, document_id, state in created:
        state.version_id = version_ids[(document_id, state.version_no)]
    jobs = conn.execute(
        """INSERT INTO embedding_jobs
               (document_version_id, embedding_model_id, max_attempts, priority)
           SELECT v, %s, %s, %s FROM unnest(%s::uuid[]) AS v
           RETURNING id, document_version_id""",
        (model_id, max_attempts, priority, [state.version_id for _, _, state in created]),
    ).fetchall()
    job_ids = {row["document_version_id"]: row["id"] for row in jobs}
    for _, _, state in created:
        state.job_id = job_ids[state.version_id]
    record_events(
        conn,
        "JOB_ENQUEUED",
        [
            (
                state.job_id,
                state.version_id,
                {"version_no": state.version_no, "byte_size": new.byte_size},
            )
            for new, _, state in created
        ],
    )


def requeue_failed_job(conn: Connection, job_id: UUID, *, extra_attempts: int) -> bool:
    """Put a FAILED job back to PENDING with a fresh budget (``jobs retry``'s own transaction,
    event and NOTIFY); False, changing nothing, when the job is not FAILED."""
    try:
        retry_failed_job(conn, job_id, extra_attempts=extra_attempts)
    except NotFound:
        return False
    return True
