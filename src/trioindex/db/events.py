"""The audit trail: appending rows to ``indexing_events``.

Every Python writer of an event goes through :func:`record_event` (the SQL functions of the
migrations insert their own). An event's ``detail`` holds ids, counts, attempt numbers, failure
types and model names only — never a claim token, chunk text, vector, credential or external
response. Call these inside the transaction whose change the event records.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from trioindex.db.pool import Connection
from trioindex.values import Claim


def record_event(
    conn: Connection,
    event_type: str,
    *,
    job_id: UUID | None = None,
    version_id: UUID | None = None,
    attempt_id: UUID | None = None,
    worker_id: UUID | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    """Append one audit event. ``detail`` holds ids, counts and classes only — never a claim
    token, chunk text, vector, credential or external response."""
    conn.execute(
        """INSERT INTO indexing_events
               (event_type, embedding_job_id, document_version_id, attempt_id, worker_id, detail)
           VALUES (%s, %s, %s, %s, %s, %s)""",
        (event_type, job_id, version_id, attempt_id, worker_id, Jsonb(detail or {})),
    )


def record_events(
    conn: Connection,
    event_type: str,
    events: Sequence[tuple[UUID | None, UUID | None, dict[str, Any]]],
) -> None:
    """:func:`record_event` for many events of one type, in one statement: each is
    ``(job_id, version_id, detail)``, under the same rule for ``detail``."""
    if not events:
        return
    conn.execute(
        """INSERT INTO indexing_events (event_type, embedding_job_id, document_version_id, detail)
           SELECT %s, e.job, e.version, e.detail
           FROM unnest(%s::uuid[], %s::uuid[], %s::jsonb[]) AS e(job, version, detail)""",
        (
            event_type,
            [job for job, _, _ in events],
            [version for _, version, _ in events],
            [Jsonb(detail) for _, _, detail in events],
        ),
    )


def record_claim_event(
    conn: Connection,
    event_type: str,
    claim: Claim,
    version_id: UUID,
    detail: dict[str, Any] | None = None,
) -> None:
    """An event about a claimed job: its ids, never its token."""
    record_event(
        conn,
        event_type,
        job_id=claim.job_id,
        version_id=version_id,
        attempt_id=claim.attempt_id,
        worker_id=claim.worker_id,
        detail=detail,
    )
