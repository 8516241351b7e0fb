-- The index over time (issue 14): deleting documents and switching the embedding model.
--
-- 1. A deleted document takes its versions, chunks, embeddings and jobs with it (the foreign
--    keys of 0001 cascade). A worker still running one of those jobs finds the job row gone at
--    its next fenced write: trioindex_lock_owned_job now raises TI003 for a missing job (it was
--    TI001), so the worker can tell "the document (or the model) was removed" from a lost
--    lease and end quietly. Nothing else in the fence changes.
--
-- 2. A model switch. embedding_models.activating marks the one model being switched to; the
--    serving model stays is_active until the new one has a SUCCEEDED job for every document's
--    current version, then trioindex_finish_switch moves is_active over in one transaction.
--    trioindex_complete_job changes in two ways: a job may complete a version another model
--    already INDEXED (it adds its own model's vectors), and only the serving model's
--    completion moves documents.current_version_id, so every current version always has the
--    serving model's full vector set and search can rank every document it finds.
--
--    A completion holds its model's row FOR KEY SHARE from before it locks the document to its
--    commit; trioindex_finish_switch locks the serving model's row FOR UPDATE before it checks
--    coverage, so it waits for the completions in flight and the ones after it see the model
--    no longer serving. No global lock: group commits of many jobs cannot deadlock on it.
--
-- 3. While a switch runs, every new job (an ingest, a requeue) for one model also gets a job
--    for the serving and the switched-to model (trigger trioindex_jobs_follow_models), so a
--    new version is indexed for both and neither model falls behind.

-- a deleted version's blob is removed only when no remaining version names it
CREATE INDEX document_versions_storage_key ON document_versions (storage_key);

ALTER TABLE embedding_models ADD COLUMN activating boolean NOT NULL DEFAULT false;
ALTER TABLE embedding_models ADD CONSTRAINT embedding_models_active_or_activating
    CHECK (NOT (is_active AND activating));
-- at most one switch at a time
CREATE UNIQUE INDEX embedding_models_one_activating ON embedding_models ((true)) WHERE activating;
-- "is any job of the switched-to model open or failed?" without a scan of every job
CREATE INDEX embedding_jobs_unfinished_by_model ON embedding_jobs (embedding_model_id)
    WHERE status IN ('PENDING', 'PROCESSING', 'FAILED');

CREATE OR REPLACE FUNCTION trioindex_lock_owned_job(
    p_job uuid, p_worker uuid, p_token uuid, p_attempt uuid)
RETURNS embedding_jobs LANGUAGE plpgsql AS $$
DECLARE
    j embedding_jobs;
    a embedding_job_attempts;
BEGIN
    SELECT * INTO j FROM embedding_jobs WHERE id = p_job FOR UPDATE;
    IF NOT FOUND THEN
        -- only a deleted document (or a removed model) takes its job rows with it
        RAISE EXCEPTION USING ERRCODE = 'TI003',
            MESSAGE = 'the job no longer exists: its document or model was removed';
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

-- Jobs of the switched-to model still to run: open, or failed on a version that is not FAILED
-- (retry it, or delete its document, to let the switch end).
CREATE FUNCTION trioindex_switch_jobs_left(p_model uuid) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM embedding_jobs j
                   JOIN document_versions v ON v.id = j.document_version_id
                   WHERE j.embedding_model_id = p_model
                     AND (j.status IN ('PENDING', 'PROCESSING')
                          OR (j.status = 'FAILED' AND v.status <> 'FAILED')))
$$;

-- End the model switch if the switched-to model now covers every document's current version:
-- it becomes the serving model and the previous one stops serving, in this transaction. True
-- when it did. Called after a completion, a delete or an activation committed, and by every
-- read of the serving model (db/models.py), so the switch happens at the first of those after
-- the last document is covered.
CREATE FUNCTION trioindex_finish_switch() RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    target uuid;
    previous uuid;
    documents_covered bigint;
BEGIN
    SELECT id INTO target FROM embedding_models WHERE activating;
    IF NOT FOUND OR trioindex_switch_jobs_left(target) THEN
        RETURN false;  -- the cheap answer while the new model's jobs run: no lock taken
    END IF;
    -- Wait for the serving model's completions in flight (they hold its row FOR KEY SHARE
    -- from before they lock a document until they commit); new ones wait for this
    -- transaction and then see the model no longer serving. So no version becomes current
    -- with the old model's vectors after the coverage check below. The serving row first,
    -- then the new one without waiting: an ingest holds the first (its job's foreign key)
    -- while it adds the new model's twin job.
    SELECT id INTO previous FROM embedding_models WHERE is_active FOR UPDATE;
    PERFORM 1 FROM embedding_models WHERE id = target AND activating FOR UPDATE SKIP LOCKED;
    IF NOT FOUND OR trioindex_switch_jobs_left(target) THEN
        RETURN false;  -- a completion of the new model is in flight: it will check again
    END IF;
    IF EXISTS (SELECT 1 FROM documents d
               WHERE d.current_version_id IS NOT NULL
                 AND NOT EXISTS (SELECT 1 FROM embedding_jobs j
                                 WHERE j.document_version_id = d.current_version_id
                                   AND j.embedding_model_id = target
                                   AND j.status = 'SUCCEEDED')) THEN
        RETURN false;
    END IF;
    -- A version the new model indexed ahead of the serving one becomes current only by the
    -- serving model's completion: wait for the serving model's jobs still open on one.
    IF EXISTS (SELECT 1 FROM embedding_jobs ahead
               JOIN embedding_jobs serving_job
                 ON serving_job.document_version_id = ahead.document_version_id
                AND serving_job.embedding_model_id = previous
                AND serving_job.status IN ('PENDING', 'PROCESSING')
               WHERE ahead.embedding_model_id = target AND ahead.status = 'SUCCEEDED') THEN
        RETURN false;
    END IF;
    -- two statements: the one-active index is checked row by row
    UPDATE embedding_models SET is_active = false WHERE is_active;
    UPDATE embedding_models SET is_active = true, activating = false WHERE id = target;
    SELECT count(*) INTO documents_covered FROM documents WHERE current_version_id IS NOT NULL;
    INSERT INTO indexing_events (event_type, detail)
    VALUES ('MODEL_SWITCHED',
            jsonb_build_object('model_id', target, 'previous_model_id', previous,
                               'documents', documents_covered));
    RETURN true;
END;
$$;

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
    serves boolean;
BEGIN
    -- lock order: job, then version, then document
    j := trioindex_lock_owned_job(p_job, p_worker, p_token, p_attempt);
    SELECT * INTO v FROM document_versions WHERE id = j.document_version_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'TI002',
            MESSAGE = 'the job''s document version does not exist';
    END IF;
    -- Whether this model serves cannot change until this commits: trioindex_finish_switch
    -- locks the serving model's row FOR UPDATE. Taken before the document row, so a switch
    -- never waits for a document while a completion waits for it.
    SELECT is_active INTO serves FROM embedding_models
    WHERE id = j.embedding_model_id FOR KEY SHARE;
    IF NOT serves AND NOT EXISTS (SELECT 1 FROM embedding_models WHERE is_active) THEN
        serves := true;  -- no model serves (all were removed): any completion may
    END IF;
    -- INDEXED: another model's job completed this version first; this one adds its vectors
    IF v.status NOT IN ('EMBEDDING', 'INDEXED') THEN
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
    IF v.status = 'EMBEDDING' THEN
        UPDATE document_versions
        SET status = 'INDEXED', indexed_at = now(), chunk_count = n_chunks
        WHERE id = v.id;
    END IF;
    -- Lock the document row on its own, then read its current version in a new statement: a
    -- statement that waited for the lock sees only the locked row's new version, not the rows it
    -- joined, so reading both in one statement could miss a newer version committed meanwhile.
    PERFORM 1 FROM documents WHERE id = v.document_id FOR UPDATE;
    SELECT cur.version_no INTO current_no
    FROM documents d JOIN document_versions cur ON cur.id = d.current_version_id
    WHERE d.id = v.document_id;
    -- the searchable version only moves forward
    became_current := current_no IS NULL OR current_no < v.version_no;
    -- and only with the serving model's vectors: search ranks with that model alone
    IF NOT serves THEN
        became_current := false;
    END IF;
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

-- A new job for one model gets a twin for the serving model and for the model being switched
-- to (if any), with the same budget and priority: during a switch a new version is indexed
-- for both, so neither falls behind. The twins' own inserts do not fire it again.
CREATE FUNCTION trioindex_jobs_follow_models() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN NULL;
    END IF;
    INSERT INTO embedding_jobs (document_version_id, embedding_model_id, max_attempts, priority)
    SELECT NEW.document_version_id, m.id, NEW.max_attempts, NEW.priority
    FROM embedding_models m
    WHERE (m.is_active OR m.activating) AND m.id <> NEW.embedding_model_id
    ON CONFLICT (document_version_id, embedding_model_id) DO NOTHING;
    RETURN NULL;
END;
$$;

CREATE TRIGGER follow_models AFTER INSERT ON embedding_jobs
    FOR EACH ROW WHEN (NEW.status = 'PENDING') EXECUTE FUNCTION trioindex_jobs_follow_models();
