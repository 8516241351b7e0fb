from typing import Any
from tests import helpers
from trioindex.db.jobs.recovery import _RECOVER_SQL, _DRAIN_SQL


def test_scratch(db: Any) -> None:
    with db.connection() as conn:
        w = helpers.worker(conn)
        m = helpers.model(conn)
        m2 = helpers.model(conn, name="other")
        conn.execute("""
        WITH d AS (INSERT INTO documents (external_key) SELECT 'd'||g FROM generate_series(1,60000) g RETURNING id, external_key),
        v AS (INSERT INTO document_versions (document_id, version_no, storage_key, original_name, content_type, byte_size, sha256)
              SELECT id, 1, 'k'||external_key, 'x.txt', 'text/plain', 1, repeat('a',64) FROM d RETURNING id)
        INSERT INTO embedding_jobs (document_version_id, embedding_model_id, max_attempts)
        SELECT id, m, 3 FROM v, unnest(ARRAY[%s::uuid, %s::uuid]) m""", (m.id, m2.id))
        conn.execute("""UPDATE embedding_jobs SET status='SUCCEEDED', finished_at=now(), chunk_count=1
                        WHERE ctid IN (SELECT ctid FROM embedding_jobs ORDER BY random() LIMIT 110000)""")
        conn.execute("""UPDATE embedding_jobs SET status='PROCESSING', worker_id=%s, claim_token=gen_random_uuid(),
                        locked_at=now(), lease_expires_at=now()+interval '5 min', attempt_count=1, attempt_id=gen_random_uuid()
                        WHERE id IN (SELECT id FROM embedding_jobs WHERE status='PENDING' LIMIT 30)""", (w,))
        conn.execute("""UPDATE embedding_jobs SET status='FAILED', finished_at=now(), attempt_count=3, last_failure_type='WORKER_INTERNAL_ERROR'
                        WHERE id IN (SELECT id FROM embedding_jobs WHERE status='PENDING' LIMIT 100)""")
        conn.execute("DROP INDEX embedding_jobs_lease, embedding_jobs_unfinished_by_model")
        conn.execute("""CREATE INDEX embedding_jobs_open_by_model ON embedding_jobs (embedding_model_id, lease_expires_at)
                        WHERE status IN ('PENDING','PROCESSING','FAILED')""")
        conn.execute("ANALYZE")
        print(conn.execute("SELECT status, count(*) FROM embedding_jobs GROUP BY 1").fetchall())
        def ex(sql, params=None):
            print("-" * 30)
            for r in conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params).fetchall():
                print(list(r.values())[0])
        rec = _RECOVER_SQL.replace("%(batch)s", "100").replace("%(initial)s", "1").replace("%(max)s", "10").replace("%(jitter)s", "0.1")
        ex("SELECT j.id FROM embedding_jobs j WHERE j.status = 'PROCESSING' AND j.lease_expires_at <= clock_timestamp() ORDER BY j.lease_expires_at LIMIT 100 FOR UPDATE SKIP LOCKED")
        ex("SELECT j.id FROM embedding_jobs j WHERE j.status = 'PROCESSING' AND j.lease_expires_at IS NOT NULL AND j.lease_expires_at <= clock_timestamp() ORDER BY j.lease_expires_at LIMIT 100 FOR UPDATE SKIP LOCKED")
        ex("SELECT trioindex_switch_jobs_left(%s)", (m.id,))
        ex("""SELECT 1 FROM embedding_jobs j
        JOIN document_versions v ON v.id = j.document_version_id
        LEFT JOIN served_versions s
          ON s.embedding_model_id = %(m)s AND s.document_id = v.document_id
        LEFT JOIN document_versions sv ON sv.id = s.document_version_id
        WHERE j.embedding_model_id = %(m)s
          AND (j.status IN ('PENDING', 'PROCESSING')
               OR (j.status = 'FAILED' AND coalesce(sv.version_no, 0) < v.version_no)) LIMIT 1""", {"m": m.id})
        ex(_DRAIN_SQL, {"model": m.id, "timeout": 30, "me": w})
