"""What a chaos run does: the workers' settings, the kill rhythm, the ingest waves, the
outages and the embedding fault rates (:class:`Options` for one run).

The run itself is testkit/chaos/run.py; bench/chaos.py describes these figures in its report.
"""

from __future__ import annotations

import attrs

MODEL = "BAAI/bge-m3"
DIMENSION = 1024
WORKERS = 3
KILL_EVERY = (3.0, 6.0)  # seconds between two kills, drawn uniformly
# When each ingest wave is due, as fractions of the fault phase. The last one comes late, so
# the kills near the end hit busy workers and the drain starts with jobs to recover.
WAVES = (0.0, 0.1, 0.2, 0.3, 0.45, 0.55, 0.68, 0.8, 0.9)


@attrs.frozen
class OutagePlan:
    """One dependency outage. It begins, after ``earliest`` (a fraction of the fault phase), as
    soon as ``backlog_sql`` counts at least ``backlog`` jobs it will hit — the workers keep up
    with ingest most of the time, so an outage at a fixed time could meet an idle fleet — and
    at ``latest`` whatever the count. It lasts ``share`` of the phase, clamped to ``limits``."""

    what: str  # "storage" or "postgresql"
    label: str
    earliest: float
    latest: float
    share: float
    limits: tuple[float, float]
    backlog: int
    backlog_sql: str
    backlog_means: str

    def length(self, duration: float) -> float:
        return min(max(duration * self.share, self.limits[0]), self.limits[1])


OUTAGES = (
    OutagePlan(
        "storage",
        "storage",
        earliest=0.3,
        latest=0.45,
        share=0.08,
        limits=(4, 12),
        backlog=4,
        # open jobs without their chunk set: the parse still reads their file from storage
        backlog_sql="""SELECT count(*) AS n FROM embedding_jobs j
                       WHERE j.status IN ('PENDING', 'PROCESSING')
                         AND NOT EXISTS (SELECT 1 FROM document_chunks c
                                         WHERE c.document_version_id = j.document_version_id
                                           AND c.chunking = j.chunking)""",
        backlog_means="jobs waiting to read their file from storage",
    ),
    OutagePlan(
        "postgresql",
        "PostgreSQL",
        earliest=0.55,
        latest=0.7,
        share=0.03,
        limits=(2, 5),
        backlog=3,
        backlog_sql="SELECT count(*) AS n FROM embedding_jobs WHERE status = 'PROCESSING'",
        backlog_means="jobs PROCESSING",
    ),
)
# Per embedding request. Transport faults are retryable; ``nan`` and ``wrong_dimension`` are not.
FAULT_RATES: dict[str, float] = {
    "status_500": 0.03,
    "status_503": 0.04,
    "status_429": 0.04,
    "disconnect": 0.02,
    "slow": 0.03,  # one second late: still inside the 2 s request timeout
    "hang": 0.02,  # never answers: the client's 2 s request timeout ends it
    "nan": 0.01,
    "wrong_dimension": 0.01,
}
HANG_SECONDS = 3.0  # how long a hung answer holds its server thread (the client gave up at 2 s)
INVALID_SHARE = 0.05  # of the documents: empty / random-bytes .pdf / truncated .docx
LONG_EVERY = 12  # every n-th valid document is long enough for several embedding batches
LONG_SENTENCES = 600
# A worker exiting on its own is excused only if it never registered and its start overlapped
# a dependency outage (plus this much for the dependency to come back): it failed fast at start.
OUTAGE_SLACK = 3.0

SHUTDOWN_GRACE = 5.0
WORKER_ENV: dict[str, str] = {
    "TRIOINDEX_EMBEDDING_API": "tei",
    "TRIOINDEX_EMBEDDING_MODEL": MODEL,
    "TRIOINDEX_EMBEDDING_DIMENSION": str(DIMENSION),
    "TRIOINDEX_EMBEDDING_REQUEST_TIMEOUT": "2s",
    "TRIOINDEX_WORKER_MAX_CONCURRENCY": "2",
    "TRIOINDEX_WORKER_POLLING_INTERVAL": "250ms",
    "TRIOINDEX_WORKER_LEASE_DURATION": "4s",
    "TRIOINDEX_WORKER_LEASE_RENEWAL_INTERVAL": "1s",
    "TRIOINDEX_WORKER_RECOVERY_INTERVAL": "1s",
    "TRIOINDEX_WORKER_HEARTBEAT_INTERVAL": "1s",
    "TRIOINDEX_WORKER_HEARTBEAT_TIMEOUT": "5s",
    "TRIOINDEX_WORKER_MAX_ATTEMPTS": "25",
    "TRIOINDEX_WORKER_RETRY_BACKOFF_INITIAL": "200ms",
    "TRIOINDEX_WORKER_RETRY_BACKOFF_MAX": "2s",
    "TRIOINDEX_WORKER_SHUTDOWN_GRACE_PERIOD": f"{SHUTDOWN_GRACE:g}s",
}


@attrs.frozen
class Options:
    duration: float
    documents: int
    seed: int
    drain_timeout: float
    fault_rates: dict[str, float] = attrs.field(factory=lambda: dict(FAULT_RATES))
    waves: tuple[float, ...] = WAVES  # when each ingest wave is due (fractions of the phase)
    # Keep injecting embedding faults while the queue drains (short runs on a busy machine may
    # otherwise embed almost nothing during the fault phase).
    faults_in_drain: bool = False
