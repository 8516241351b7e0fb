"""What operators read and do: queue counts, job listings with attempts (a page of them, the
jobs a filter matches, or the jobs an id prefix names), a job's events, workers and the jobs
they run, manual retry, the progress of waited-for jobs, documents with each model's state of
them, and activity over time (jobs succeeded, chunks, failed and expired attempts per bucket).

Synchronous, one transaction each, used by the CLI and the wait through :meth:`Database.run`.
Nothing here returns a claim token, chunk text or vector.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import attrs

from trioindex.db.jobs import retry_failed
from trioindex.db.models import ModelView, finish_switch, model_list
from trioindex.db.pool import Connection
from trioindex.errors import FailureType, NotFound
from trioindex.values import AttemptView, JobStatus, JobView

_JOB_SELECT = """
SELECT j.id, j.status, j.priority, j.attempt_count, j.max_attempts, j.available_at, j.worker_id,
       j.lease_expires_at, j.progress, j.last_failure_type, j.last_failure_message, j.created_at,
       j.finished_at, j.chunk_count, d.external_key, v.version_no,
       EXISTS (SELECT 1 FROM served_versions s
               WHERE s.embedding_model_id = j.embedding_model_id
                 AND s.document_version_id = j.document_version_id) AS version_served,
       m.name AS model_name,
       (SELECT count(*) FROM embedding_job_attempts a
        WHERE a.embedding_job_id = j.id AND a.status <> 'CANCELLED'
          AND a.started_at > coalesce(
              (SELECT max(e.created_at) FROM indexing_events e
               WHERE e.embedding_job_id = j.id AND e.event_type = 'JOB_RETRY_REQUESTED'),
              '-infinity')) AS attempts_spent
FROM embedding_jobs j
JOIN document_versions v ON v.id = j.document_version_id
JOIN documents d ON d.id = v.document_id
JOIN embedding_models m ON m.id = j.embedding_model_id
"""


@attrs.frozen
class QueueStatus:
    jobs_by_status: dict[str, int]
    oldest_pending_age_seconds: float | None
    retries_scheduled: int
    failures_by_type: dict[str, int]
    workers: tuple[WorkerView, ...]
    serving_model: str | None = None
    switch: ModelView | None = None  # the model being switched to: covered / documents


@attrs.frozen
class WorkerView:
    id: UUID
    hostname: str
    pid: int
    status: str
    max_concurrency: int
    heartbeat_age_seconds: float
    running_jobs: int
    lost: bool

    @property
    def state(self) -> str:
        return "LOST" if self.lost else self.status


def queue_status(conn: Connection, *, heartbeat_timeout: float) -> QueueStatus:
    finish_switch(conn)  # a model switch whose new model covers everything takes effect here
    with conn.transaction():
        by_status = {
            row["status"]: row["n"]
            for row in conn.execute(
                "SELECT status, count(*) AS n FROM embedding_jobs GROUP BY status"
            ).fetchall()
        }
        pending = conn.execute(
            """SELECT extract(epoch FROM now() - min(created_at))::float8 AS oldest,
                      count(*) FILTER (WHERE attempt_count > 0 AND available_at > now()) AS retries
               FROM embedding_jobs WHERE status = 'PENDING'"""
        ).fetchone()
        failures = {
            row["t"]: row["n"]
            for row in conn.execute(
                """SELECT last_failure_type AS t, count(*) AS n FROM embedding_jobs
                   WHERE status = 'FAILED' GROUP BY last_failure_type ORDER BY 2 DESC"""
            ).fetchall()
        }
        workers = worker_views(conn, heartbeat_timeout=heartbeat_timeout)
    assert pending is not None
    models = model_list(conn)
    return QueueStatus(
        jobs_by_status={s.value: by_status.get(s.value, 0) for s in JobStatus},
        oldest_pending_age_seconds=pending["oldest"],
        retries_scheduled=pending["retries"],
        failures_by_type=failures,
        workers=workers,
        serving_model=next((m.name for m in models if m.serving), None),
        switch=next((m for m in models if m.activating), None),
    )


def worker_views(conn: Connection, *, heartbeat_timeout: float) -> tuple[WorkerView, ...]:
    """Workers not stopped, and those stopped within the last hour, newest first; LOST when
    their heartbeat is older than ``heartbeat_timeout`` seconds."""
    return tuple(
        WorkerView(
            id=row["id"],
            hostname=row["hostname"],
            pid=row["pid"],
            status=row["status"],
            max_concurrency=row["max_concurrency"],
            heartbeat_age_seconds=row["age"],
            running_jobs=row["running"],
            lost=row["status"] != "STOPPED" and row["age"] > heartbeat_timeout,
        )
        for row in conn.execute(
            """SELECT w.*, extract(epoch FROM now() - w.last_heartbeat_at)::float8 AS age,
                      (SELECT count(*) FROM embedding_jobs j
                        WHERE j.worker_id = w.id AND j.status = 'PROCESSING') AS running
               FROM indexing_workers w
               WHERE w.status <> 'STOPPED' OR w.stopped_at > now() - interval '1 hour'
               ORDER BY w.started_at DESC"""
        ).fetchall()
    )


@attrs.frozen
class JobFilter:
    """Which jobs a listing shows: each field None (or "") matches every job. ``since``
    keeps the jobs created at or after it; ``key_prefix`` the jobs of documents whose key
    starts with it."""

    status: JobStatus | None = None
    failure_type: FailureType | None = None
    model: str | None = None
    key_prefix: str = ""
    since: datetime | None = None

    def where(self) -> tuple[str, dict[str, Any]]:
        """The SQL condition on ``_JOB_SELECT``'s aliases, and its parameters."""
        return (
            """(%(status)s::text IS NULL OR j.status = %(status)s)
               AND (%(failure)s::text IS NULL OR j.last_failure_type = %(failure)s)
               AND (%(model)s::text IS NULL OR m.name = %(model)s)
               AND starts_with(d.external_key, %(prefix)s)
               AND (%(since)s::timestamptz IS NULL OR j.created_at >= %(since)s)""",
            {
                "status": self.status.value if self.status else None,
                "failure": self.failure_type.value if self.failure_type else None,
                "model": self.model,
                "prefix": self.key_prefix,
                "since": self.since,
            },
        )


def list_jobs(
    conn: Connection,
    *,
    status: JobStatus | None = None,
    limit: int = 50,
    where: JobFilter | None = None,
    offset: int = 0,
) -> list[JobView]:
    """The newest jobs ``where`` matches (or of ``status``), from ``offset``, at most
    ``limit``."""
    condition, params = (where or JobFilter(status=status)).where()
    rows = conn.execute(
        f"""{_JOB_SELECT} WHERE {condition}
            ORDER BY j.created_at DESC, j.id LIMIT %(limit)s OFFSET %(offset)s""",
        {**params, "limit": limit, "offset": offset},
    ).fetchall()
    return [JobView.from_row(row) for row in rows]


def count_jobs(conn: Connection, where: JobFilter) -> int:
    """How many jobs ``where`` matches."""
    condition, params = where.where()
    row = conn.execute(
        f"""SELECT count(*) AS n FROM embedding_jobs j
            JOIN document_versions v ON v.id = j.document_version_id
            JOIN documents d ON d.id = v.document_id
            JOIN embedding_models m ON m.id = j.embedding_model_id
            WHERE {condition}""",
        params,
    ).fetchone()
    return int(row["n"]) if row else 0


def show_job(conn: Connection, job_id: UUID) -> JobView:
    with conn.transaction():
        row = conn.execute(f"{_JOB_SELECT} WHERE j.id = %s", (job_id,)).fetchone()
        if row is None:
            raise NotFound(f"no job with id {job_id}")
        attempts = tuple(
            AttemptView.from_row(a)
            for a in conn.execute(
                """SELECT * FROM embedding_job_attempts
                   WHERE embedding_job_id = %s ORDER BY attempt_no""",
                (job_id,),
            ).fetchall()
        )
    return JobView.from_row(row, attempts)


def retry_failed_job(conn: Connection, job_id: UUID, *, extra_attempts: int) -> JobView:
    """FAILED → PENDING with a fresh budget of ``extra_attempts`` attempts (the transition is
    :func:`trioindex.db.jobs.retry_failed`); the job as it is now.

    The version goes back to UPLOADED so the whole pipeline runs again (the parse step replaces
    the chunks atomically; attempt numbers continue where they stopped).
    """
    retry_failed(conn, job_id, extra_attempts=extra_attempts)
    return show_job(conn, job_id)


def failed_job_ids(conn: Connection, failure_type: FailureType | None = None) -> list[UUID]:
    """The FAILED jobs, oldest first; only those whose last failure is ``failure_type`` when
    one is given."""
    return [
        row["id"]
        for row in conn.execute(
            """SELECT id FROM embedding_jobs
               WHERE status = 'FAILED' AND (%(t)s::text IS NULL OR last_failure_type = %(t)s)
               ORDER BY created_at""",
            {"t": failure_type.value if failure_type else None},
        ).fetchall()
    ]


def fresh_worker_on_host(conn: Connection, hostname: str, max_age_seconds: float) -> bool:
    """True when a RUNNING worker on ``hostname`` sent a heartbeat within ``max_age_seconds``."""
    row = conn.execute(
        """SELECT 1 FROM indexing_workers
           WHERE hostname = %s AND status = 'RUNNING'
             AND last_heartbeat_at > now() - make_interval(secs => %s) LIMIT 1""",
        (hostname, max_age_seconds),
    ).fetchone()
    return row is not None


def live_worker_count(conn: Connection, max_age_seconds: float) -> int:
    """RUNNING workers (any host) that sent a heartbeat within ``max_age_seconds``."""
    row = conn.execute(
        """SELECT count(*) AS n FROM indexing_workers
           WHERE status = 'RUNNING' AND last_heartbeat_at > now() - make_interval(secs => %s)""",
        (max_age_seconds,),
    ).fetchone()
    return int(row["n"]) if row else 0


def jobs_progress(conn: Connection, job_ids: list[UUID]) -> list[dict[str, Any]]:
    """Status, progress, chunk count and failure type of the given jobs (for ``ingest --wait``)."""
    return conn.execute(
        """SELECT j.id, j.status, j.progress, j.last_failure_type, j.last_failure_message,
                  d.external_key, j.chunk_count,
                  (SELECT count(*) FROM embeddings e
                    WHERE e.document_version_id = j.document_version_id
                      AND e.embedding_model_id = j.embedding_model_id) AS embedded
           FROM embedding_jobs j
           JOIN document_versions v ON v.id = j.document_version_id
           JOIN documents d ON d.id = v.document_id
           WHERE j.id = ANY(%s)""",
        (job_ids,),
    ).fetchall()


def abandoned_leases(
    conn: Connection, job_ids: list[UUID], heartbeat_timeout: float
) -> list[dict[str, Any]]:
    """The given jobs that are PROCESSING under a worker that is not live (not RUNNING, or no
    heartbeat within ``heartbeat_timeout`` seconds): each with its document key, that worker
    and when its lease expires (``seconds_left``, 0 once it has), for ``ingest --wait``."""
    return conn.execute(
        """SELECT j.id, d.external_key, j.worker_id, j.lease_expires_at,
                  greatest(0, extract(epoch FROM j.lease_expires_at - now()))::float8
                      AS seconds_left
           FROM embedding_jobs j
           JOIN document_versions v ON v.id = j.document_version_id
           JOIN documents d ON d.id = v.document_id
           WHERE j.id = ANY(%s) AND j.status = 'PROCESSING'
             AND NOT EXISTS (
                 SELECT 1 FROM indexing_workers w
                 WHERE w.id = j.worker_id AND w.status = 'RUNNING'
                   AND w.last_heartbeat_at > now() - make_interval(secs => %s))
           ORDER BY d.external_key""",
        (job_ids, heartbeat_timeout),
    ).fetchall()


# --- pages of jobs, jobs by id prefix, documents -----------------------------------------------


@attrs.frozen
class JobPage:
    """The newest ``jobs`` (each with its attempts) and how many jobs the filter matches."""

    jobs: tuple[JobView, ...]
    total: int


def job_page(conn: Connection, *, status: JobStatus | None = None, limit: int = 50) -> JobPage:
    """:func:`list_jobs` with every listed job's attempts, and the count of all it matched."""
    with conn.transaction():
        jobs = list_jobs(conn, status=status, limit=limit)
        total = count_jobs(conn, JobFilter(status=status))
        attempts: dict[UUID, list[AttemptView]] = {}
        for a in conn.execute(
            """SELECT * FROM embedding_job_attempts WHERE embedding_job_id = ANY(%s)
               ORDER BY embedding_job_id, attempt_no""",
            ([j.id for j in jobs],),
        ).fetchall():
            attempts.setdefault(a["embedding_job_id"], []).append(AttemptView.from_row(a))
    listed = tuple(attrs.evolve(j, attempts=tuple(attempts.get(j.id, ()))) for j in jobs)
    return JobPage(listed, total)


def job_ids_with_prefix(conn: Connection, prefix: str, *, limit: int = 2) -> list[UUID]:
    """Up to ``limit`` job ids whose text form starts with ``prefix`` (lower-case hex and
    hyphens, as the ids are printed)."""
    return [
        row["id"]
        for row in conn.execute(
            "SELECT id FROM embedding_jobs WHERE starts_with(id::text, %s) ORDER BY id LIMIT %s",
            (prefix, limit),
        ).fetchall()
    ]


# --- documents and each model's state of them ----------------------------------------------------

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


# --- what the console charts: events of a job, what workers run, activity over time ----------


@attrs.frozen
class EventView:
    """One entry of a job's timeline: its type, time, attempt and worker, and ``detail`` (ids,
    counts, attempt numbers, failure types and model names only). ``id`` is the event row's;
    None for ``JOB_CLAIMED`` and ``JOB_SUCCEEDED``, which are read from the attempt row."""

    id: int | None
    event_type: str
    created_at: datetime
    attempt_id: UUID | None
    worker_id: UUID | None
    detail: dict[str, Any]


# The job's event rows, and its claims and success from its attempt rows (each attempt's
# started_at is a claim; a SUCCEEDED attempt's finished_at the success, with the job's chunk
# count: a job succeeds once). At one time, a claim comes first and a success last.
_TIMELINE_SQL = """
SELECT * FROM (
    SELECT e.id, e.event_type, e.created_at, e.attempt_id, e.worker_id, e.detail, 1 AS rank
    FROM indexing_events e WHERE e.embedding_job_id = %(job)s
    UNION ALL
    SELECT NULL, 'JOB_CLAIMED', a.started_at, a.id, a.worker_id,
           jsonb_build_object('attempt_no', a.attempt_no), 0
    FROM embedding_job_attempts a WHERE a.embedding_job_id = %(job)s
    UNION ALL
    SELECT NULL, 'JOB_SUCCEEDED', a.finished_at, a.id, a.worker_id,
           jsonb_build_object('attempt_no', a.attempt_no, 'chunks', j.chunk_count,
                              'became_current', a.became_current), 2
    FROM embedding_job_attempts a JOIN embedding_jobs j ON j.id = a.embedding_job_id
    WHERE a.embedding_job_id = %(job)s AND a.status = 'SUCCEEDED'
) AS timeline
ORDER BY created_at, rank, id LIMIT %(limit)s
"""


def job_events(conn: Connection, job_id: UUID, *, limit: int = 500) -> list[EventView]:
    """The first ``limit`` entries of a job's timeline, oldest first: its events, and its
    claims and success as its attempt rows record them."""
    return [
        EventView(
            row["id"],
            row["event_type"],
            row["created_at"],
            row["attempt_id"],
            row["worker_id"],
            row["detail"],
        )
        for row in conn.execute(_TIMELINE_SQL, {"job": job_id, "limit": limit}).fetchall()
    ]


@attrs.frozen
class RunningJob:
    """A PROCESSING job as its worker's row shows it."""

    job_id: UUID
    worker_id: UUID
    document_key: str
    version_no: int
    model: str
    progress: int
    attempt_count: int
    lease_expires_at: datetime | None


def running_jobs(conn: Connection) -> list[RunningJob]:
    """Every PROCESSING job, by worker, oldest claim first."""
    return [
        RunningJob(
            row["id"],
            row["worker_id"],
            row["external_key"],
            row["version_no"],
            row["model_name"],
            row["progress"],
            row["attempt_count"],
            row["lease_expires_at"],
        )
        for row in conn.execute(
            f"""{_JOB_SELECT} WHERE j.status = 'PROCESSING' AND j.worker_id IS NOT NULL
                ORDER BY j.worker_id, j.locked_at, j.id"""
        ).fetchall()
    ]


@attrs.frozen
class ActivityBucket:
    """What finished in one time bucket: jobs that succeeded (``documents``) and their
    ``chunks``, failed attempts by failure type, and attempts whose lease expired."""

    start: datetime
    documents: int
    chunks: int
    failures: dict[str, int]
    lease_recoveries: int


@attrs.frozen
class Activity:
    """Buckets of ``bucket_seconds`` covering the last ``window_seconds``, oldest first."""

    window_seconds: int
    bucket_seconds: int
    buckets: tuple[ActivityBucket, ...]


def activity(conn: Connection, *, window_seconds: int, bucket_seconds: int) -> Activity:
    """Throughput and failures over the last ``window_seconds``, in buckets aligned to
    ``bucket_seconds`` (the newest bucket holds now): jobs finished ``SUCCEEDED`` by their
    ``finished_at``, failed and expired attempts by theirs. One snapshot."""
    params = {"window": window_seconds, "bucket": bucket_seconds}
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        origin = conn.execute(
            """SELECT date_bin(make_interval(secs => %(bucket)s), now(), 'epoch')
                      - make_interval(secs => %(window)s - %(bucket)s) AS first""",
            params,
        ).fetchone()
        assert origin is not None
        first: datetime = origin["first"]
        span = {**params, "first": first}
        done = conn.execute(
            """SELECT floor(extract(epoch FROM finished_at - %(first)s) / %(bucket)s)::int AS b,
                      count(*) AS documents, coalesce(sum(chunk_count), 0)::bigint AS chunks
               FROM embedding_jobs
               WHERE status = 'SUCCEEDED' AND finished_at >= %(first)s
               GROUP BY 1""",
            span,
        ).fetchall()
        attempts = conn.execute(
            """SELECT floor(extract(epoch FROM finished_at - %(first)s) / %(bucket)s)::int AS b,
                      status, failure_type, count(*) AS n
               FROM embedding_job_attempts
               WHERE status IN ('FAILED', 'EXPIRED') AND finished_at >= %(first)s
               GROUP BY 1, 2, 3""",
            span,
        ).fetchall()
    count = window_seconds // bucket_seconds
    documents = {r["b"]: (r["documents"], r["chunks"]) for r in done}
    failures: dict[int, dict[str, int]] = {}
    expired: dict[int, int] = {}
    for r in attempts:
        if r["status"] == "EXPIRED":
            expired[r["b"]] = expired.get(r["b"], 0) + r["n"]
        else:
            failures.setdefault(r["b"], {})[r["failure_type"]] = r["n"]
    buckets = tuple(
        ActivityBucket(
            start=first + timedelta(seconds=i * bucket_seconds),
            documents=documents.get(i, (0, 0))[0],
            chunks=int(documents.get(i, (0, 0))[1]),
            failures=failures.get(i, {}),
            lease_recoveries=expired.get(i, 0),
        )
        for i in range(count)
    )
    return Activity(window_seconds, bucket_seconds, buckets)
