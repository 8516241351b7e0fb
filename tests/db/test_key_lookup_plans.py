"""Migration 0008's plan settings on a real PostgreSQL: the fence's key lookups are index scans
even when their plans were made while the tables were nearly empty (a fresh database, a first
bulk load)."""

from __future__ import annotations

from tests import helpers
from trioindex.db import jobs as lifecycle
from trioindex.db.fence import claim_arrays
from trioindex.db.pool import Connection, Database
from trioindex.values import Claim


def sequential_scans(conn: Connection, table: str) -> int:
    """Sequential scans of ``table`` by this session's current transaction."""
    row = conn.execute(
        "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = %s", (table,)
    ).fetchone()
    assert row is not None
    return int(row["seq_scan"])


def fence(conn: Connection, claim: Claim) -> None:
    conn.execute(
        "SELECT id FROM trioindex_lock_owned_job(%s, %s, %s, %s)",
        (claim.job_id, claim.worker_id, claim.claim_token, claim.attempt_id),
    )


def three_claims_on_tiny_analysed_tables(conn: Connection) -> list[Claim]:
    """Three claimed jobs, and what autovacuum does to a new table after its first rows:
    statistics of a small table (one page), where a sequential scan costs least."""
    model = helpers.model(conn)
    for _ in range(3):
        helpers.enqueue(conn, model.id)
    claims = lifecycle.claim_jobs(conn, helpers.worker(conn), 3, 300)
    conn.execute("ANALYZE embedding_jobs, embedding_job_attempts, document_versions")
    return claims


def test_the_fence_finds_the_attempt_by_index_while_the_table_is_tiny(db: Database) -> None:
    with db.connection() as conn:
        claims = three_claims_on_tiny_analysed_tables(conn)
        # a dozen calls on one connection: five custom plans, then the cached generic one
        with conn.transaction():
            for _ in range(4):
                for claim in claims:
                    fence(conn, claim)
            assert sequential_scans(conn, "embedding_job_attempts") == 0
            assert sequential_scans(conn, "embedding_jobs") == 0


def test_the_group_fence_finds_its_jobs_by_key_while_the_tables_are_tiny(db: Database) -> None:
    with db.connection() as conn:
        claims = three_claims_on_tiny_analysed_tables(conn)
        with conn.transaction():
            # past the five custom plans, onto the cached generic one
            for _ in range(7):
                conn.execute(
                    "SELECT * FROM trioindex_fence_many(%s, %s, %s, %s)", claim_arrays(claims)
                )
            for table in ("embedding_jobs", "embedding_job_attempts", "document_versions"):
                assert sequential_scans(conn, table) == 0, table


def test_a_completion_reads_one_served_row_per_document_whatever_the_model_serves(
    db: Database,
) -> None:
    """The completion looks up each document's served row by its key: the rows it fetches by
    index do not grow with the rows the model already serves (plans made while the table was
    empty, then cached, as in a worker's first minutes)."""
    group = 3
    with db.connection() as conn:
        model = helpers.model(conn, "plans-model", 4)
        for _ in range(30):
            helpers.enqueue(conn, model.id)
        conn.execute("ANALYZE served_versions")  # empty: every plan's cheapest guess
        worker = helpers.worker(conn)
        read = []
        while claims := lifecycle.claim_jobs(conn, worker, group, 300):
            for claim in claims:
                helpers.stage_embedded(conn, claim)
            with conn.transaction():
                for claim in claims:
                    lifecycle.complete_job(conn, claim)
                row = conn.execute(
                    """SELECT idx_tup_fetch AS n FROM pg_stat_xact_user_tables
                       WHERE relname = 'served_versions'"""
                ).fetchone()
                assert row is not None
                read.append(int(row["n"]))
    assert len(read) == 10
    assert max(read) <= 2 * group, read


def rows_read(conn: Connection, table: str) -> int:
    """Rows of ``table`` read by sequential scans and through indexes in this session's
    transaction (the connection's one open transaction: take differences)."""
    row = conn.execute(
        """SELECT seq_tup_read + coalesce(idx_tup_fetch, 0) AS n
           FROM pg_stat_xact_user_tables WHERE relname = %s""",
        (table,),
    ).fetchone()
    assert row is not None
    return int(row["n"])


def test_claims_and_completions_read_no_more_rows_when_one_document_holds_thousands(
    db: Database,
) -> None:
    """The claim's chunk-set check and the completion's text statistics look up each job's
    own version by key: the chunks and vectors they read do not grow with what is already
    stored, even when the statistics say one version holds every chunk (one large document
    indexed, then analysed, before the small ones)."""
    stored, group = 3000, 3
    with db.connection() as conn:
        model = helpers.model(conn, "plans-model", 4)
        helpers.enqueue(conn, model.id)
        worker = helpers.worker(conn)
        [large] = lifecycle.claim_jobs(conn, worker, 1, 300)
        helpers.stage_embedded(conn, large, chunks=stored)
        lifecycle.complete_job(conn, large)
        for _ in range(4 * group):
            helpers.enqueue(conn, model.id)
        conn.execute("ANALYZE document_chunks, embeddings")
        read: list[dict[str, int]] = []
        while True:
            chunks_before = rows_read(conn, "document_chunks")
            claims = lifecycle.claim_jobs(conn, worker, group, 300)
            if not claims:
                break
            claim_chunks = rows_read(conn, "document_chunks") - chunks_before
            for claim in claims:
                helpers.stage_embedded(conn, claim)
            chunks_before = rows_read(conn, "document_chunks")
            vectors_before = rows_read(conn, "embeddings")
            for claim in claims:
                lifecycle.complete_job(conn, claim)
            read.append(
                {
                    "claim chunks": claim_chunks,
                    "completion chunks": rows_read(conn, "document_chunks") - chunks_before,
                    "completion vectors": rows_read(conn, "embeddings") - vectors_before,
                }
            )
    assert len(read) == 4
    # a few rows per job (its own chunks, vectors and key lookups), not the large set's thousands
    assert all(n <= 20 * group for step in read for n in step.values()), read


def test_lease_recovery_reads_the_leased_jobs_not_the_backlog_beside_them(db: Database) -> None:
    """The open-jobs index holds the PENDING and FAILED jobs too; recovery reads only the
    entries with a lease (the PROCESSING jobs), however many jobs wait beside them."""
    backlog = 400
    with db.connection() as conn:
        model = helpers.model(conn)
        conn.execute(
            """WITH d AS (INSERT INTO documents (external_key)
                          SELECT 'backlog-' || g FROM generate_series(1, %s) AS g RETURNING id),
                    v AS (INSERT INTO document_versions (document_id, version_no, storage_key,
                                                         original_name, byte_size, sha256)
                          SELECT id, 1, 'k', 'a.txt', 1, repeat('a', 64) FROM d RETURNING id)
               INSERT INTO embedding_jobs (document_version_id, embedding_model_id, max_attempts)
               SELECT id, %s, 3 FROM v""",
            (backlog, model.id),
        )
        claims = lifecycle.claim_jobs(conn, helpers.worker(conn), 3, 300)
        helpers.expire_lease(conn, claims[0].job_id)
        conn.execute("ANALYZE embedding_jobs")
        with conn.transaction():
            before = rows_read(conn, "embedding_jobs")
            recovered = lifecycle.recover_expired(conn, helpers.BACKOFF)
            read = rows_read(conn, "embedding_jobs") - before
    assert [r.job_id for r in recovered] == [claims[0].job_id]
    # the three leased jobs and the recovered one's update, not the 397 waiting
    assert read <= 10, read
