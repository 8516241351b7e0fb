-- Two fixes to the job lifecycle (issue 11):
--
-- 1. trioindex_complete_job read the document's current version in the same statement that
--    locked the document row (`... LEFT JOIN document_versions cur ... FOR UPDATE OF d`). When the
--    completions of v2 and v3 race, v2 waits on the document lock; after v3 commits, PostgreSQL
--    re-checks the locked documents row but keeps the old join result (NULL), so v2 replaced v3.
--    Now the document row is locked first and the current version is read in a fresh statement,
--    which in READ COMMITTED takes a new snapshot and so sees the winner's commit.
--
-- 2. Shutdown hands unfinished claims back: trioindex_release_job closes the attempt as
--    CANCELLED and returns the job to PENDING at once. A cancelled attempt keeps its number
--    (attempt numbers stay consecutive) but does not spend the budget: max_attempts grows by one.

ALTER TABLE embedding_job_attempts DROP CONSTRAINT embedding_job_attempts_status_check;
ALTER TABLE embedding_job_attempts ADD CONSTRAINT embedding_job_attempts_status_check
    CHECK (status IN ('STARTED', 'SUCCEEDED', 'FAILED', 'EXPIRED', 'CANCELLED'));

CREATE OR REPLACE FUNCTION trioindex_complete_job(
    p_job uuid, p_worker uuid, p_token uuid, p_attempt uuid)
RETURNS TABLE (became_current boolean, chunks integer) LANGUAGE plpgsql AS $$
DECLARE
    j embedding_jobs;
    v document_versions;
    n_chunks integer;
    n_vectors integer;
    current_no integer;
    attempt integer;
BEGIN
    -- lock order: job, then version, then document
    j := trioindex_lock_owned_job(p_job, p_worker, p_token, p_attempt);
    SELECT * INTO v FROM document_versions WHERE id = j.document_version_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'TI002',
            MESSAGE = 'the job''s document version does not exist';
    END IF;
    IF v.status <> 'EMBEDDING' THEN
        RAISE EXCEPTION USING ERRCODE = 'TI002',
            MESSAGE = format('cannot complete: version is %s, expected EMBEDDING', v.status);
    END IF;
    SELECT count(*) INTO n_chunks FROM document_chunks WHERE document_version_id = v.id;
    SELECT count(*) INTO n_vectors FROM embeddings
    WHERE document_version_id = v.id AND embedding_model_id = j.embedding_model_id;
    IF n_chunks = 0 OR n_chunks <> n_vectors THEN
        RAISE EXCEPTION USING ERRCODE = 'TI002',
            MESSAGE = format('cannot complete: %s embeddings for %s chunks', n_vectors, n_chunks);
    END IF;
    UPDATE document_versions
    SET status = 'INDEXED', indexed_at = now(), chunk_count = n_chunks
    WHERE id = v.id;
    -- Lock the document row on its own, then read its current version in a new statement: a
    -- statement that waited for the lock sees only the locked row's new version, not the rows it
    -- joined, so reading both in one statement could miss a newer version committed meanwhile.
    PERFORM 1 FROM documents WHERE id = v.document_id FOR UPDATE;
    SELECT cur.version_no INTO current_no
    FROM documents d JOIN document_versions cur ON cur.id = d.current_version_id
    WHERE d.id = v.document_id;
    -- the searchable version only moves forward
    became_current := current_no IS NULL OR current_no < v.version_no;
    IF became_current THEN
        UPDATE documents SET current_version_id = v.id WHERE id = v.document_id;
    END IF;
    UPDATE embedding_job_attempts SET status = 'SUCCEEDED', finished_at = now()
    WHERE id = p_attempt
    RETURNING attempt_no INTO attempt;
    UPDATE embedding_jobs
    SET status = 'SUCCEEDED', progress = 100, finished_at = now(),
        worker_id = NULL, claim_token = NULL, locked_at = NULL, lease_expires_at = NULL,
        last_failure_type = NULL, last_failure_message = NULL
    WHERE id = p_job;
    INSERT INTO indexing_events
        (event_type, embedding_job_id, document_version_id, attempt_id, worker_id, detail)
    VALUES ('JOB_SUCCEEDED', p_job, v.id, p_attempt, p_worker,
            jsonb_build_object('attempt_no', attempt, 'chunks', n_chunks,
                               'became_current', became_current));
    chunks := n_chunks;
    RETURN NEXT;
END;
$$;

-- Hand a claim back unfinished (worker shutdown): fenced by the same ownership check as every
-- other write, so a claim that lease recovery or another worker already took is refused (TI001)
-- and nothing changes. The version keeps its status, so the next claim resumes where this one
-- stopped (parse again, or embed what is missing).
CREATE FUNCTION trioindex_release_job(p_job uuid, p_worker uuid, p_token uuid, p_attempt uuid)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    j embedding_jobs;
BEGIN
    j := trioindex_lock_owned_job(p_job, p_worker, p_token, p_attempt);
    UPDATE embedding_job_attempts SET status = 'CANCELLED', finished_at = now()
    WHERE id = p_attempt;
    UPDATE embedding_jobs
    SET status = 'PENDING', available_at = now(), max_attempts = max_attempts + 1,
        worker_id = NULL, claim_token = NULL, locked_at = NULL, lease_expires_at = NULL
    WHERE id = p_job;
    INSERT INTO indexing_events
        (event_type, embedding_job_id, document_version_id, attempt_id, worker_id, detail)
    VALUES ('JOB_RELEASED', p_job, j.document_version_id, p_attempt, p_worker,
            jsonb_build_object('attempt_no', j.attempt_count, 'reason', 'shutdown'));
    NOTIFY trioindex_jobs;
    RETURN j.attempt_count;
END;
$$;
