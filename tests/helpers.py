"""Small builders shared by the database tests: a model, a worker, enqueued jobs."""

from __future__ import annotations

import hashlib
import uuid
from uuid import UUID

import attrs

from testkit import jobs as testkit_jobs
from testkit.jobs import enqueue_text
from trioindex.db import jobs as lifecycle
from trioindex.db.models import EmbeddingModel, ensure_model
from trioindex.db.pool import Connection
from trioindex.ingest import IngestResult
from trioindex.values import BackoffPolicy, Claim

BACKOFF = BackoffPolicy(initial=10.0, maximum=600.0, jitter=0.0)


def model(conn: Connection, name: str = "test-model", dimension: int = 4) -> EmbeddingModel:
    return ensure_model(conn, name, dimension)


def worker(conn: Connection, max_concurrency: int = 8, *, chunking: str = "characters") -> UUID:
    return lifecycle.register_worker(
        conn,
        hostname="test-host",
        pid=1,
        version="test",
        max_concurrency=max_concurrency,
        chunking=chunking,
    )


def enqueue(
    conn: Connection,
    model_id: UUID,
    key: str | None = None,
    *,
    content: bytes | None = None,
    max_attempts: int = 3,
    priority: int = 0,
) -> IngestResult:
    key = key or f"doc-{uuid.uuid4().hex[:8]}"
    data = content if content is not None else key.encode()
    return enqueue_text(conn, model_id, key, data, max_attempts=max_attempts, priority=priority)


def expire_lease(conn: Connection, job_id: UUID) -> None:
    """Move the lease into the past, as if the lease duration had gone by."""
    conn.execute(
        "UPDATE embedding_jobs SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE id = %s",
        (job_id,),
    )


def make_available(conn: Connection, job_id: UUID) -> None:
    """Move a scheduled retry's available_at into the past, as if its backoff had gone by."""
    conn.execute(
        "UPDATE embedding_jobs SET available_at = now() - interval '1 second' WHERE id = %s",
        (job_id,),
    )


def stage_embedded(conn: Connection, claim: Claim, dimension: int = 4, chunks: int = 2) -> None:
    """Put the claimed version in EMBEDDING with a full embedding set (what steps 5-6 leave)."""
    version = conn.execute(
        "SELECT document_id FROM document_versions WHERE id = %s", (claim.document_version_id,)
    ).fetchone()
    assert version is not None
    testkit_jobs.stage_embedded(
        conn,
        claim.document_version_id,
        version["document_id"],
        claim.embedding_model_id,
        dimension=dimension,
        chunks=chunks,
    )


def job_row(conn: Connection, job_id: UUID) -> dict[str, object]:
    row = conn.execute("SELECT * FROM embedding_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return row


def events(conn: Connection, job_id: UUID) -> list[str]:
    rows = conn.execute(
        "SELECT event_type FROM indexing_events WHERE embedding_job_id = %s ORDER BY id", (job_id,)
    ).fetchall()
    return [row["event_type"] for row in rows]


def stage_chunked(conn: Connection, claim: Claim, texts: list[str]) -> None:
    """Put the claimed version in CHUNKED with one chunk per text (what step 5 leaves)."""
    version = conn.execute(
        "SELECT document_id FROM document_versions WHERE id = %s", (claim.document_version_id,)
    ).fetchone()
    assert version is not None
    offset = 0
    for index, text in enumerate(texts):
        conn.execute(
            """INSERT INTO document_chunks (document_id, document_version_id, chunk_index, content,
                   char_start, char_end, token_count, content_sha256)
               VALUES (%s, %s, %s, %s, %s, %s, %s, %s)""",
            (
                version["document_id"],
                claim.document_version_id,
                index,
                text,
                offset,
                offset + len(text),
                len(text.split()),
                hashlib.sha256(text.encode()).hexdigest(),
            ),
        )
        offset += len(text)
    conn.execute(
        "UPDATE document_versions SET status = 'CHUNKED', chunk_count = %s WHERE id = %s",
        (len(texts), claim.document_version_id),
    )


def count(conn: Connection, sql: str, *params: object) -> int:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return int(next(iter(row.values())))


FORGERIES = ("stale token", "other worker", "wrong attempt", "expired lease")


def forge(conn: Connection, claim: Claim, forgery: str) -> Claim:
    """A claim that must be refused: stale token, another worker, a wrong attempt, or (after
    expiring the real lease) the real claim itself."""
    if forgery == "expired lease":
        expire_lease(conn, claim.job_id)
        return claim
    if forgery == "stale token":
        return attrs.evolve(claim, claim_token=uuid.uuid4())
    if forgery == "other worker":
        return attrs.evolve(claim, worker_id=worker(conn))
    if forgery == "wrong attempt":
        return attrs.evolve(claim, attempt_id=uuid.uuid4())
    raise ValueError(forgery)


def waits_on_a_lock(conn: Connection, pid: int) -> bool:
    """Whether the backend ``pid`` is waiting on a lock now (seen in ``pg_stat_activity``): how
    race tests know the other side is blocked before they let the first one go."""
    row = conn.execute(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return row is not None and row["wait_event_type"] == "Lock"
