"""Small builders shared by the database tests: a model, a worker, enqueued jobs."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import attrs
import psycopg
import trio

from testkit import jobs as testkit_jobs
from testkit.embed_server import fake_vector
from testkit.jobs import enqueue_text
from trioindex.config import default_settings
from trioindex.db import jobs as lifecycle
from trioindex.db.models import INDEX_BUILD_LOCK, EmbeddingModel, ensure_model
from trioindex.db.operations.job_timeline import job_events
from trioindex.db.pool import Connection, Database
from trioindex.embedding import Embedder, EmbedderInfo
from trioindex.embedding.vectors import Vectors, validate_vectors
from trioindex.ingest import IngestResult
from trioindex.pipeline.chunking import Chunker
from trioindex.storage import AsyncObjectStore
from trioindex.values import CHARACTER_CHUNKING, BackoffPolicy, Claim, CompleteResult
from trioindex.worker.job import steps_for
from trioindex.worker.wiring import WHOLE_DOCUMENT_BYTES, PipelineSteps, build_chunker

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


def renew_one(conn: Connection, claim: Claim, lease_seconds: float) -> datetime:
    """Renew one claim's lease through the group renewal; its refusal is raised."""
    (result,) = lifecycle.renew_leases(conn, [claim], lease_seconds)
    if isinstance(result, Exception):
        raise result
    return result


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
    """Give the claimed version a chunk set with a full embedding set (what the parse and
    embed steps leave before the completion)."""
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
    """The job's timeline as an operator reads it (``jobs show``, the console): its event rows
    with its claims and success read from its attempts."""
    return [e.event_type for e in job_events(conn, job_id)]


def stage_chunked(conn: Connection, claim: Claim, texts: list[str]) -> None:
    """Give the claimed version a chunk set of one chunk per text (what the parse leaves)."""
    stage_chunks(conn, claim.document_version_id, texts)


def stage_chunks(
    conn: Connection, version_id: UUID, texts: Sequence[str], chunking: str = CHARACTER_CHUNKING
) -> None:
    """Give the version the chunk set ``chunking`` of one chunk per text (what a parse leaves);
    a job claimed after it has ``chunks_ready`` and only embeds."""
    version = conn.execute(
        "SELECT document_id FROM document_versions WHERE id = %s", (version_id,)
    ).fetchone()
    assert version is not None
    offset = 0
    for index, text in enumerate(texts):
        conn.execute(
            """INSERT INTO document_chunks (document_id, document_version_id, chunking,
                   chunk_index, content, char_start, char_end, token_count, content_sha256)
               VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)""",
            (
                version["document_id"],
                version_id,
                chunking,
                index,
                text,
                offset,
                offset + len(text),
                len(text.split()),
                hashlib.sha256(text.encode()).hexdigest(),
            ),
        )
        offset += len(text)


def served(conn: Connection, document_id: UUID, model_id: UUID) -> UUID | None:
    """The version ``model_id`` serves for the document (None when it serves none)."""
    row = conn.execute(
        """SELECT document_version_id FROM served_versions
           WHERE document_id = %s AND embedding_model_id = %s""",
        (document_id, model_id),
    ).fetchone()
    return None if row is None else row["document_version_id"]


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


def build_lock_held(conn: Connection, model: EmbeddingModel) -> bool:
    """Whether some session holds the model's index build lock (a build under way)."""
    row = conn.execute(
        """SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'
                          AND classid = %s AND objid = hashtext(%s)::oid) AS held""",
        (INDEX_BUILD_LOCK, str(model.id)),
    ).fetchone()
    return row is not None and bool(row["held"])


# -- the worker's own pipeline steps ----------------------------------------------------------


@attrs.define(eq=False)
class FakeEmbedder:
    """An in-process :class:`~trioindex.embedding.Embedder`: for each text the vector the fake
    embedding server answers (``testkit.embed_server.fake_vector``); counts calls and texts."""

    dimension: int = 4
    batch_size: int = 256
    model: str = "test-model"
    calls: int = 0
    texts: int = 0

    @property
    def info(self) -> EmbedderInfo:
        return EmbedderInfo.configured(self.model, self.dimension, self.batch_size)

    async def embed(self, texts: Sequence[str]) -> Vectors:
        await trio.lowlevel.checkpoint()
        self.calls += 1
        self.texts += len(texts)
        vectors = [fake_vector(text, self.dimension) for text in texts]
        return validate_vectors(vectors, expected_count=len(texts), dimension=self.dimension)

    async def aclose(self) -> None:
        return None


def pipeline_steps(
    db: Database,
    store: AsyncObjectStore,
    embedder: Embedder,
    *,
    chunker: Chunker | None = None,
    max_document_bytes: int | None = None,
    parse_timeout: float | None = None,
    whole_document_bytes: int = WHOLE_DOCUMENT_BYTES,
) -> PipelineSteps:
    """The worker's steps bound as ``build_worker`` binds them, from the default settings
    (the chunker, the size limit and the parse time limit may be given instead);
    ``whole_document_bytes=0`` stores every document's chunks first, as a large one's."""
    settings = default_settings()
    parsing = settings.parsing
    return PipelineSteps(
        db=db,
        store=store,
        chunker=build_chunker(settings, embedder) if chunker is None else chunker,
        embedder=embedder,
        max_document_bytes=(
            parsing.max_document_bytes if max_document_bytes is None else max_document_bytes
        ),
        parse_timeout=parsing.timeout if parse_timeout is None else parse_timeout,
        max_in_flight=settings.embedding.max_in_flight,
        whole_document_bytes=whole_document_bytes,
    )


async def run_claim(steps: PipelineSteps, claim: Claim, *names: str) -> list[int | CompleteResult]:
    """Run ``claim`` through the worker's steps as its job runner does: the steps
    ``steps_for`` picks for it (or ``names``), one after the other, with ``steps.serve()``
    running beside them (the coalescer and the group committers) and cancelled after. Returns
    each step's result; a step's exception is raised as itself, not in an exception group.
    Once the job has ended (its last step was ``complete``, or a step raised or was cancelled)
    the steps forget the claim, as the runner does."""
    names = names or steps_for(chunks_ready=claim.chunks_ready)
    results: list[int | CompleteResult] = []
    failure: Exception | None = None
    ended = True
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(steps.serve)
            try:
                for name in names:
                    results.append(await getattr(steps, name)(claim))
            except Exception as exc:
                failure = exc
            finally:
                nursery.cancel_scope.cancel()
        ended = failure is not None or names[-1] == "complete"
    finally:
        if ended:
            steps.forget(claim)
    if failure is not None:
        raise failure
    return results


def serves(conn: Connection, claim: Claim) -> bool:
    """Whether the claim's model serves the claim's version of its document."""
    version = conn.execute(
        "SELECT document_id FROM document_versions WHERE id = %s", (claim.document_version_id,)
    ).fetchone()
    assert version is not None
    return served(conn, version["document_id"], claim.embedding_model_id) == (
        claim.document_version_id
    )


#: The steps an attempt row records, in the order a job runs them.
ATTEMPT_STEPS = ("parse_started", "chunks_stored", "embedding_started", "embeddings_stored")


def attempt_row(conn: Connection, job_id: UUID) -> dict[str, Any]:
    """The job's newest attempt."""
    row = conn.execute(
        """SELECT * FROM trioindex_job_attempts WHERE embedding_job_id = %s
           ORDER BY attempt_no DESC LIMIT 1""",
        (job_id,),
    ).fetchone()
    assert row is not None
    return dict(row)


def steps(conn: Connection, job_id: UUID) -> list[str]:
    """The steps the job's newest attempt has recorded (:data:`ATTEMPT_STEPS` whose time is
    set), in the order a job runs them."""
    row = attempt_row(conn, job_id)
    return [step for step in ATTEMPT_STEPS if row[f"{step}_at"] is not None]


def delete_document_of(conn: Connection, claim: Claim) -> None:
    """Delete the document of the claim's version (its jobs go with it), as `delete` does."""
    conn.execute(
        """SELECT trioindex_delete_document(d.external_key) FROM documents d
           JOIN document_versions v ON v.document_id = d.id WHERE v.id = %s""",
        (claim.document_version_id,),
    )


def plans_made(conn: Connection, action: Callable[[], object]) -> list[str]:
    """The plans PostgreSQL made on ``conn`` while ``action`` ran, each as its plan tree's text
    (``debug_print_plan`` logs every plan it makes, nested statements' included)."""
    logged: list[tuple[str | None, str | None]] = []

    def on_notice(diagnostic: psycopg.errors.Diagnostic) -> None:
        # read now: it is freed after the call
        logged.append((diagnostic.message_primary, diagnostic.message_detail))

    conn.add_notice_handler(on_notice)
    conn.execute("SET debug_print_plan = on")
    conn.execute("SET client_min_messages = log")
    try:
        action()
    finally:
        conn.execute("RESET client_min_messages")
        conn.execute("RESET debug_print_plan")
        conn.remove_notice_handler(on_notice)
    return [detail or "" for primary, detail in logged if primary == "plan:"]
