-- Fencing and completion as server-side functions: one round trip instead of eleven.
--
-- trioindex_lock_owned_job is the one definition of "this claim still owns the job"; Python's
-- lifecycle.lock_owned_job calls it, and so does trioindex_complete_job. Errors carry their own
-- SQLSTATEs so the caller can tell them apart from database failures:
--   TI001  ownership lost (the write changed nothing; lease recovery owns the job)
--   TI002  state inconsistent (job / attempt / version do not agree)

CREATE FUNCTION trioindex_lock_owned_job(p_job uuid, p_worker uuid, p_token uuid, p_attempt uuid)
RETURNS embedding_jobs LANGUAGE plpgsql AS $$
DECLARE
    j embedding_jobs;
    a embedding_job_attempts;
BEGIN
    SELECT * INTO j FROM embedding_jobs WHERE id = p_job FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'TI001', MESSAGE = 'the job no longer exists';
    END IF;
    IF j.status <> 'PROCESSING' THEN
        RAISE EXCEPTION USING ERRCODE = 'TI001',
            MESSAGE = format('the job is %s, not PROCESSING', j.status);
    END IF;
    IF j.worker_id IS DISTINCT FROM p_worker THEN
        RAISE EXCEPTION USING ERRCODE = 'TI001', MESSAGE = 'the job is claimed by another worker';
    END IF;
    IF j.claim_token IS DISTINCT FROM p_token THEN
        RAISE EXCEPTION USING ERRCODE = 'TI001',
            MESSAGE = 'the claim token belongs to an older claim';
    END IF;
    -- a fresh clock, not the transaction's start time
    IF j.lease_expires_at <= clock_timestamp() THEN
        RAISE EXCEPTION USING ERRCODE = 'TI001', MESSAGE = 'the lease has expired';
    END IF;
    SELECT * INTO a FROM embedding_job_attempts
    WHERE id = p_attempt AND embedding_job_id = p_job;
    IF NOT FOUND OR a.status <> 'STARTED' OR a.worker_id <> p_worker
       OR a.attempt_no <> j.attempt_count THEN
        RAISE EXCEPTION USING ERRCODE = 'TI001',
            MESSAGE = 'the attempt is not the job''s current STARTED attempt';
    END IF;
    RETURN j;
END;
$$;

CREATE FUNCTION trioindex_complete_job(p_job uuid, p_worker uuid, p_token uuid, p_attempt uuid)
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
    SELECT cur.version_no INTO current_no
    FROM documents d LEFT JOIN document_versions cur ON cur.id = d.current_version_id
    WHERE d.id = v.document_id
    FOR UPDATE OF d;
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
