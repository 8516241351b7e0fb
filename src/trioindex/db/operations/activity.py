"""Activity over time, as the console charts it: jobs succeeded and their chunks, failed
attempts by failure type and expired leases, per time bucket."""

from __future__ import annotations

from datetime import datetime, timedelta

import attrs

from trioindex.db.pool import Connection


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
