-- Every trioindex function and trigger, in their one current text.
--
-- `migrate` applies the versioned migrations (NNNN_*.sql: tables, indexes, data), then this
-- file whenever its text differs from the one last applied: in one transaction it drops every
-- function named trioindex_* (and, by CASCADE, the triggers that call them) and runs this
-- file, so the database holds exactly what is written here. A change to the fence's checks is
-- an edit of trioindex_ownership_refusal below, and nowhere else.
--
-- Lock order, everywhere: job rows, then version rows, then model rows (FOR KEY SHARE), then
-- document rows. Refusals carry their own SQLSTATEs (trioindex.db.fence maps them):
--   TI001  ownership lost (the write changed nothing; lease recovery owns the job)
--   TI002  state inconsistent (job / attempt / version / chunks do not agree)
--   TI003  the job no longer exists (its document was deleted or its model removed)
-- The transitions each function performs are listed in docs/design/state-machine.md.

-- updated_at on every update ----------------------------------------------------------------
--
-- The trigger stamps now() on an update that leaves updated_at as it was; a statement that
-- sets updated_at = now() itself (the claim, the completion, the lease renewal: the updates
-- made once or more per job) skips the call, its WHEN tested without entering PL/pgSQL (the
-- call was 4-13 us per job row, measured). No statement sets updated_at to anything else.

CREATE FUNCTION trioindex_touch_updated_at() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated_at := now();
    RETURN NEW;
END;
$$;

CREATE TRIGGER touch BEFORE UPDATE ON embedding_models
    FOR EACH ROW WHEN (NEW.updated_at IS NOT DISTINCT FROM OLD.updated_at)
    EXECUTE FUNCTION trioindex_touch_updated_at();
CREATE TRIGGER touch BEFORE UPDATE ON documents
    FOR EACH ROW WHEN (NEW.updated_at IS NOT DISTINCT FROM OLD.updated_at)
    EXECUTE FUNCTION trioindex_touch_updated_at();
CREATE TRIGGER touch BEFORE UPDATE ON document_versions
    FOR EACH ROW WHEN (NEW.updated_at IS NOT DISTINCT FROM OLD.updated_at)
    EXECUTE FUNCTION trioindex_touch_updated_at();
CREATE TRIGGER touch BEFORE UPDATE ON document_chunks
    FOR EACH ROW WHEN (NEW.updated_at IS NOT DISTINCT FROM OLD.updated_at)
    EXECUTE FUNCTION trioindex_touch_updated_at();
CREATE TRIGGER touch BEFORE UPDATE ON embeddings
    FOR EACH ROW WHEN (NEW.updated_at IS NOT DISTINCT FROM OLD.updated_at)
    EXECUTE FUNCTION trioindex_touch_updated_at();
CREATE TRIGGER touch BEFORE UPDATE ON indexing_workers
    FOR EACH ROW WHEN (NEW.updated_at IS NOT DISTINCT FROM OLD.updated_at)
    EXECUTE FUNCTION trioindex_touch_updated_at();
CREATE TRIGGER touch BEFORE UPDATE ON embedding_jobs
    FOR EACH ROW WHEN (NEW.updated_at IS NOT DISTINCT FROM OLD.updated_at)
    EXECUTE FUNCTION trioindex_touch_updated_at();
CREATE TRIGGER touch BEFORE UPDATE ON served_versions
    FOR EACH ROW WHEN (NEW.updated_at IS NOT DISTINCT FROM OLD.updated_at)
    EXECUTE FUNCTION trioindex_touch_updated_at();

-- the fence ----------------------------------------------------------------------------------

-- Why a claim (worker p_worker, claim token p_token, attempt p_attempt) does not own job j, or
-- NULL when it does: the job is PROCESSING, held by this worker with this claim token, its
-- lease has not expired by a fresh clock, and p_attempt is the attempt it runs (the id its
-- claim drew; the job row holds the running attempt). j must be read under its row lock. The
-- one text of "this claim still owns the job": the fence of one job and of a group ask it.
CREATE FUNCTION trioindex_ownership_refusal(
    j embedding_jobs, p_attempt uuid, p_worker uuid, p_token uuid)
RETURNS text LANGUAGE sql VOLATILE AS $$
    SELECT CASE
        WHEN j.status <> 'PROCESSING' THEN format('the job is %s, not PROCESSING', j.status)
        WHEN j.worker_id IS DISTINCT FROM p_worker THEN 'the job is claimed by another worker'
        WHEN j.claim_token IS DISTINCT FROM p_token
            THEN 'the claim token belongs to an older claim'
        -- a fresh clock, not the transaction's start time
        WHEN j.lease_expires_at <= clock_timestamp() THEN 'the lease has expired'
        WHEN j.attempt_id IS DISTINCT FROM p_attempt
            THEN 'the attempt is not the one the job runs'
    END
$$;

-- The fence of one claim: lock the job row, then refuse unless the claim owns it. Every write
-- of one job after the claim runs it first.
CREATE FUNCTION trioindex_lock_owned_job(p_job uuid, p_worker uuid, p_token uuid, p_attempt uuid)
RETURNS embedding_jobs LANGUAGE plpgsql AS $$
DECLARE
    j embedding_jobs;
    refused text;
BEGIN
    SELECT * INTO j FROM embedding_jobs WHERE id = p_job FOR UPDATE;
    IF NOT FOUND THEN
        -- only a deleted document (or a removed model) takes its job rows with it
        RAISE EXCEPTION USING ERRCODE = 'TI003',
            MESSAGE = 'the job no longer exists: its document or model was removed';
    END IF;
    refused := trioindex_ownership_refusal(j, p_attempt, p_worker, p_token);
    IF refused IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'TI001', MESSAGE = refused;
    END IF;
    RETURN j;
END;
$$;

-- The fence of a group of claims (element i: job p_jobs[i], claimed by p_workers[i] with
-- p_tokens[i] and attempt p_attempts[i]) in one locking statement: the jobs the group still
-- owns are locked in id order (the check in the statement's WHERE, so a refused job is not
-- locked), then their versions in id order. codes[i] and messages[i] are NULL for an owned
-- job, else its refusal: TI003 (the job is gone), TI001 (ownership lost, with the reason read
-- again after the lock) or TI002 (no version row).
CREATE FUNCTION trioindex_fence_many(
    p_jobs uuid[], p_workers uuid[], p_tokens uuid[], p_attempts uuid[],
    OUT codes text[], OUT messages text[])
LANGUAGE plpgsql AS $$
DECLARE
    owned uuid[];
    versions uuid[];
    locked uuid[];
BEGIN
    SELECT coalesce(array_agg(l.id), '{}'), coalesce(array_agg(l.document_version_id), '{}')
    INTO owned, versions
    FROM (SELECT j.id, j.document_version_id FROM embedding_jobs j
          JOIN unnest(p_jobs, p_workers, p_tokens, p_attempts) AS u(job, worker, token, attempt)
            ON u.job = j.id
          WHERE trioindex_ownership_refusal(j, u.attempt, u.worker, u.token) IS NULL
          ORDER BY j.id FOR UPDATE OF j) AS l;
    SELECT coalesce(array_agg(l.id), '{}') INTO locked
    FROM (SELECT v.id FROM document_versions v WHERE v.id = ANY(versions)
          ORDER BY v.id FOR UPDATE) AS l;
    IF cardinality(owned) = cardinality(p_jobs)
       AND cardinality(locked) = (SELECT count(DISTINCT x) FROM unnest(versions) AS x) THEN
        -- the usual group: every job owned, every version there
        codes := array_fill(NULL::text, ARRAY[cardinality(p_jobs)]);
        messages := codes;
        RETURN;
    END IF;
    SELECT array_agg(r.code ORDER BY u.ord), array_agg(r.message ORDER BY u.ord)
    INTO codes, messages
    FROM unnest(p_jobs, p_workers, p_tokens, p_attempts) WITH ORDINALITY
         AS u(job, worker, token, attempt, ord)
    LEFT JOIN embedding_jobs j ON j.id = u.job
    CROSS JOIN LATERAL (
        SELECT x.code, x.message FROM (VALUES
            (1, j.id IS NULL, 'TI003',
             'the job no longer exists: its document or model was removed'),
            (2, NOT (j.id = ANY(owned)), 'TI001',
             coalesce(trioindex_ownership_refusal(j, u.attempt, u.worker, u.token),
                      'the claim no longer owns the job')),
            (3, NOT (j.document_version_id = ANY(locked)), 'TI002',
             'the job''s document version does not exist'),
            (4, true, NULL, NULL)) AS x(rank, refused, code, message)
        WHERE x.refused ORDER BY x.rank LIMIT 1) AS r;
END;
$$;

-- The version row of a locked job, locked after it, checked to exist.
CREATE FUNCTION trioindex_lock_version(p_version uuid) RETURNS document_versions
LANGUAGE plpgsql AS $$
DECLARE
    v document_versions;
BEGIN
    SELECT * INTO v FROM document_versions WHERE id = p_version FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'TI002',
            MESSAGE = 'the job''s document version does not exist';
    END IF;
    RETURN v;
END;
$$;

-- The row an attempt leaves when it ends (status p_status, with p_failure_type and
-- p_failure_message for FAILED): the running attempt the claim recorded on job row j — its id,
-- number, worker, start (locked_at) and the steps it ran (the attempt_* columns) — ended now.
-- The one mapping from the job row to the attempt row; every end of an attempt inserts it
-- before the same statement or the next frees the job row. A completion adds the steps it ran
-- in the same transaction: p_stored vectors just stored (a slice: vectors, slices and their
-- time), p_parse_started, and p_chunks > 0 chunks of the set it stored with p_characters and
-- p_replaced; and p_became_current.
CREATE FUNCTION trioindex_ended_attempt(
    j embedding_jobs, p_status text, p_failure_type text DEFAULT NULL,
    p_failure_message text DEFAULT NULL, p_became_current boolean DEFAULT NULL,
    p_stored integer DEFAULT 0, p_parse_started timestamptz DEFAULT NULL,
    p_chunks integer DEFAULT NULL, p_characters integer DEFAULT NULL,
    p_replaced integer DEFAULT NULL)
RETURNS SETOF embedding_job_attempts LANGUAGE sql STABLE AS $$
    SELECT j.attempt_id, j.id, j.attempt_count, j.worker_id, p_status, p_failure_type,
           p_failure_message, j.locked_at, now(), now(), now(),
           coalesce(p_parse_started, j.attempt_parse_started_at),
           CASE WHEN p_chunks > 0 THEN now() ELSE j.attempt_chunks_stored_at END,
           CASE WHEN p_chunks > 0 THEN p_chunks ELSE j.attempt_chunks END,
           CASE WHEN p_chunks > 0 THEN p_characters ELSE j.attempt_characters END,
           CASE WHEN p_chunks > 0 THEN nullif(p_replaced, 0)
                ELSE j.attempt_replaced_sequences END,
           -- vectors stored by an attempt that began no embed step: embedded before this
           -- store, which is the step's start the attempt records
           CASE WHEN p_stored > 0 THEN coalesce(j.attempt_embedding_started_at, now())
                ELSE j.attempt_embedding_started_at END,
           CASE WHEN p_stored > 0 THEN now() ELSE j.attempt_embeddings_stored_at END,
           CASE WHEN p_stored > 0 THEN coalesce(j.attempt_embeddings, 0) + p_stored
                ELSE j.attempt_embeddings END,
           CASE WHEN p_stored > 0 THEN coalesce(j.attempt_embedding_slices, 0) + 1
                ELSE j.attempt_embedding_slices END,
           p_became_current
$$;

-- Every attempt: the ended ones (their rows) and the running one of each PROCESSING job (on
-- its row, status STARTED, not finished), with the columns of embedding_job_attempts. What
-- every reader of a job's attempts reads (jobs show, the HTTP job detail, the console, the
-- timeline); writers write the table.
CREATE VIEW trioindex_job_attempts AS
SELECT a.id, a.embedding_job_id, a.attempt_no, a.worker_id, a.status, a.failure_type,
       a.failure_message, a.started_at, a.finished_at, a.parse_started_at, a.chunks_stored_at,
       a.chunks, a.characters, a.replaced_sequences, a.embedding_started_at,
       a.embeddings_stored_at, a.embeddings, a.embedding_slices, a.became_current
FROM embedding_job_attempts a
UNION ALL
SELECT j.attempt_id, j.id, j.attempt_count, j.worker_id, 'STARTED', NULL, NULL, j.locked_at,
       NULL, j.attempt_parse_started_at, j.attempt_chunks_stored_at, j.attempt_chunks,
       j.attempt_characters, j.attempt_replaced_sequences, j.attempt_embedding_started_at,
       j.attempt_embeddings_stored_at, j.attempt_embeddings, j.attempt_embedding_slices, NULL
FROM embedding_jobs j WHERE j.status = 'PROCESSING';

-- the claim ------------------------------------------------------------------------------------

-- Claim up to p_limit claimable PENDING jobs (p_model's only, when not NULL) for worker p_worker,
-- which must be RUNNING, and start an attempt on each: highest priority first, then oldest
-- available_at, rows locked by another claimer skipped. The attempt runs on the job row (its
-- start is locked_at, its id attempt_id); its row is written when it ends, and no event is
-- written for the claim. One row with job_id NULL when nothing was claimed; model_found false
-- when p_model no longer exists. The transaction's commit does not wait for the WAL to reach the
-- disk (synchronous_commit off, local to it): a claim lost in a crash leaves the job PENDING with
-- no attempt, as if never claimed, the worker's later writes are refused by the fence, and any
-- later synchronous commit flushes the claim's WAL before its own. Each row also carries what the
-- parse reads, and whether the job's chunk set is stored (chunks_ready).
-- A function so that its plan is cached by the server connection, also behind a transaction
-- pooler, where a client prepares nothing: the statement sent as text was planned on every
-- call, about 1 ms of PostgreSQL's CPU a claim against 0.2-0.3 here (a claim finding nothing
-- is what every idle worker makes for each NOTIFY; docs/test-results/fleet.md, run 33).
CREATE FUNCTION trioindex_claim(
    p_worker uuid, p_limit integer, p_lease double precision, p_model uuid)
RETURNS TABLE (model_found boolean, job_id uuid, worker_id uuid, claim_token uuid,
               document_version_id uuid, embedding_model_id uuid, lease_expires_at timestamptz,
               attempt_id uuid, attempt_no integer, document_key text, chunking text,
               document_id uuid, storage_key text, original_name text, content_type text,
               byte_size bigint, sha256 text, parse_started_at timestamptz, chunks_ready boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH worker AS (
        SELECT w.id, w.chunking FROM indexing_workers w
        WHERE w.id = p_worker AND w.status = 'RUNNING'
          AND set_config('synchronous_commit', 'off', true) IS NOT NULL
    ), picked AS (
        SELECT j.id
        FROM embedding_jobs j, worker
        WHERE j.status = 'PENDING' AND j.available_at <= now()
          AND (p_model IS NULL OR j.embedding_model_id = p_model)
        ORDER BY j.priority DESC, j.available_at, j.id
        LIMIT p_limit
        FOR UPDATE OF j SKIP LOCKED
    ), claimed AS (
        UPDATE embedding_jobs j
        SET status = 'PROCESSING', worker_id = p_worker, claim_token = gen_random_uuid(),
            -- updated_at set here, so the touch trigger is not called (its WHEN)
            locked_at = now(), updated_at = now(),
            lease_expires_at = now() + make_interval(secs => p_lease),
            attempt_count = j.attempt_count + 1, chunking = worker.chunking,
            attempt_id = gen_random_uuid(),
            -- a new attempt starts with no steps (db/jobs/attempt_steps.py)
            attempt_parse_started_at = NULL, attempt_chunks_stored_at = NULL,
            attempt_chunks = NULL, attempt_characters = NULL, attempt_replaced_sequences = NULL,
            attempt_embedding_started_at = NULL, attempt_embeddings_stored_at = NULL,
            attempt_embeddings = NULL, attempt_embedding_slices = NULL
        FROM picked, worker
        WHERE j.id = picked.id
        RETURNING j.id, j.worker_id, j.claim_token, j.document_version_id, j.embedding_model_id,
                  j.attempt_count, j.lease_expires_at, j.chunking, j.attempt_id
    )
    SELECT model.found, c.id, c.worker_id, c.claim_token, c.document_version_id,
           c.embedding_model_id, c.lease_expires_at, c.attempt_id, c.attempt_count,
           d.external_key, c.chunking, v.document_id, v.storage_key, v.original_name,
           v.content_type, v.byte_size, v.sha256, now(),
           -- the set's first chunk by its key: an EXISTS is planned as a sequential scan
           -- when the statistics say a version holds many chunks (one large document), read
           -- to the end for a version without chunks; the first of an ordered set is an index
           -- probe whatever they say
           (SELECT ch.id FROM document_chunks ch
            WHERE ch.document_version_id = c.document_version_id AND ch.chunking = c.chunking
            ORDER BY ch.chunk_index LIMIT 1) IS NOT NULL
    FROM (SELECT p_model IS NULL
                 OR EXISTS (SELECT FROM embedding_models m WHERE m.id = p_model) AS found
         ) AS model
    LEFT JOIN (claimed c
               JOIN document_versions v ON v.id = c.document_version_id
               JOIN documents d ON d.id = v.document_id) ON true;
END;
$$;

-- lease and retry delay -----------------------------------------------------------------------

-- The retry backoff in seconds: initial * 2^(attempt_no - 1), capped at maximum, spread by
-- ± jitter. unit_random is a draw in [0, 1): lease recovery passes random(), a failure report
-- its own draw (so a test can fix it).
CREATE FUNCTION trioindex_retry_delay(
    p_attempt_no integer, p_initial float8, p_maximum float8, p_jitter float8,
    p_unit_random float8)
RETURNS float8 LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(0,
        least(p_maximum, p_initial * power(2::float8, greatest(p_attempt_no - 1, 0)))
        * (1 + p_jitter * (2 * p_unit_random - 1)))
$$;

-- Extend the leases of a group of claims (element i: job p_jobs[i], claimed by p_workers[i] with
-- p_tokens[i] and attempt p_attempts[i]) in one statement, from a fresh clock read once the locks
-- are held: the jobs the group still owns are locked in id order (the fence's check in the
-- WHERE, so a refused job is not locked) and extended. Row ord = i says job i's new expiry, or
-- (lease_expires_at NULL) why it was refused: TI003 (the job is gone) or TI001 (ownership lost,
-- the reason read again after the lock). Never touches the worker, the token or locked_at.
CREATE FUNCTION trioindex_renew_leases(
    p_jobs uuid[], p_workers uuid[], p_tokens uuid[], p_attempts uuid[], p_lease_seconds float8)
RETURNS TABLE (ord bigint, lease_expires_at timestamptz, code text, message text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    owned uuid[];
    expires timestamptz;
BEGIN
    SELECT coalesce(array_agg(held.id), '{}') INTO owned
    FROM (SELECT j.id FROM embedding_jobs j
          JOIN unnest(p_jobs, p_workers, p_tokens, p_attempts) AS c(job, worker, token, attempt)
            ON c.job = j.id
          WHERE trioindex_ownership_refusal(j, c.attempt, c.worker, c.token) IS NULL
          ORDER BY j.id FOR UPDATE OF j) AS held;
    expires := clock_timestamp() + make_interval(secs => p_lease_seconds);
    UPDATE embedding_jobs SET lease_expires_at = expires WHERE id = ANY(owned);
    RETURN QUERY
    SELECT u.ord,
           CASE WHEN u.job = ANY(owned) THEN expires END,
           CASE WHEN u.job = ANY(owned) THEN NULL WHEN j.id IS NULL THEN 'TI003' ELSE 'TI001' END,
           CASE WHEN u.job = ANY(owned) THEN NULL
                WHEN j.id IS NULL
                    THEN 'the job no longer exists: its document or model was removed'
                ELSE coalesce(trioindex_ownership_refusal(j, u.attempt, u.worker, u.token),
                              'the claim no longer owns the job') END
    FROM unnest(p_jobs, p_workers, p_tokens, p_attempts) WITH ORDINALITY
         AS u(job, worker, token, attempt, ord)
    LEFT JOIN embedding_jobs j ON j.id = u.job
    ORDER BY u.ord;
END;
$$;

-- Hand a claim back unfinished (worker shutdown): PROCESSING -> PENDING at once, the attempt
-- CANCELLED; the cancelled attempt keeps its number but does not spend the budget. The next
-- claim resumes from what is stored (its chunk set, if the parse committed).
CREATE FUNCTION trioindex_release_job(p_job uuid, p_worker uuid, p_token uuid, p_attempt uuid)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    j embedding_jobs;
BEGIN
    j := trioindex_lock_owned_job(p_job, p_worker, p_token, p_attempt);
    INSERT INTO embedding_job_attempts SELECT * FROM trioindex_ended_attempt(j, 'CANCELLED');
    UPDATE embedding_jobs
    SET status = 'PENDING', available_at = now(), max_attempts = max_attempts + 1,
        worker_id = NULL, claim_token = NULL, locked_at = NULL, lease_expires_at = NULL,
        attempt_id = NULL,
        -- the ended attempt's steps are in its row now
        attempt_parse_started_at = NULL, attempt_chunks_stored_at = NULL,
        attempt_chunks = NULL, attempt_characters = NULL, attempt_replaced_sequences = NULL,
        attempt_embedding_started_at = NULL, attempt_embeddings_stored_at = NULL,
        attempt_embeddings = NULL, attempt_embedding_slices = NULL
    WHERE id = p_job;
    INSERT INTO indexing_events
        (event_type, embedding_job_id, document_version_id, attempt_id, worker_id, detail)
    VALUES ('JOB_RELEASED', p_job, j.document_version_id, p_attempt, p_worker,
            jsonb_build_object('attempt_no', j.attempt_count, 'reason', 'shutdown'));
    NOTIFY trioindex_jobs;
    RETURN j.attempt_count;
END;
$$;

-- the application's contract: enqueue and delete from SQL -----------------------------------
--
-- Versioned with the schema and documented in docs/design/integration.md; SECURITY DEFINER, so
-- a role that may only EXECUTE them (and read trioindex_document_states) can register and
-- delete documents without any right on the tables.

-- Register document versions whose bytes are already in the configured storage, in the
-- caller's transaction. For element i: the document p_keys[i] (created if new), a new version
-- unless the document's newest version has the same sha256 ('unchanged', nothing written), and
-- a PENDING job for p_model (NULL: the model serving search; the follow_models trigger adds the
-- model being switched to). NOTIFY trioindex_jobs is delivered at commit: a rolled-back
-- transaction enqueues nothing and wakes nobody. A key given twice becomes two versions in
-- that order. Document rows are locked in key order, so two calls over overlapping keys wait
-- for each other instead of deadlocking. Bad input is refused (SQLSTATE 22023) naming the
-- element and the field, before anything is written.
CREATE FUNCTION trioindex_enqueue_documents(
    p_keys text[], p_storage_keys text[], p_sha256s text[], p_byte_sizes bigint[],
    p_content_types text[] DEFAULT NULL, p_original_names text[] DEFAULT NULL,
    p_priority integer DEFAULT 0, p_max_attempts integer DEFAULT 5, p_model uuid DEFAULT NULL,
    p_source_etags text[] DEFAULT NULL)
RETURNS TABLE (ord integer, document_key text, status text, document_id uuid,
               version_id uuid, version_no integer, job_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    n integer := coalesce(array_length(p_keys, 1), 0);
    model uuid := p_model;
    created boolean := false;
    row_out record;
BEGIN
    IF coalesce(array_length(p_storage_keys, 1), 0) <> n
       OR coalesce(array_length(p_sha256s, 1), 0) <> n
       OR coalesce(array_length(p_byte_sizes, 1), 0) <> n
       OR (p_content_types IS NOT NULL AND coalesce(array_length(p_content_types, 1), 0) <> n)
       OR (p_original_names IS NOT NULL AND coalesce(array_length(p_original_names, 1), 0) <> n)
       OR (p_source_etags IS NOT NULL AND coalesce(array_length(p_source_etags, 1), 0) <> n)
    THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'trioindex_enqueue_documents: the arrays must all have one element per key';
    END IF;
    IF p_max_attempts IS NULL OR p_max_attempts < 1 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'max_attempts must be at least 1';
    END IF;
    FOR i IN 1 .. n LOOP
        IF p_keys[i] IS NULL OR length(p_keys[i]) NOT BETWEEN 1 AND 1024 THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('element %s: the key must be 1 to 1024 characters', i);
        ELSIF p_storage_keys[i] IS NULL OR length(p_storage_keys[i]) NOT BETWEEN 1 AND 1024 THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('element %s: the storage key must be 1 to 1024 characters', i);
        ELSIF p_sha256s[i] IS NULL OR p_sha256s[i] !~ '^[0-9a-f]{64}$' THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('element %s: sha256 must be 64 lower-case hex digits', i);
        ELSIF p_byte_sizes[i] IS NULL OR p_byte_sizes[i] < 0 THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('element %s: byte_size must be 0 or more', i);
        END IF;
    END LOOP;
    IF model IS NULL THEN
        SELECT m.id INTO model FROM embedding_models m WHERE m.is_active;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = 'no embedding model serves yet: start a worker once (it registers its'
                          ' model) or pass p_model';
        END IF;
    ELSIF NOT EXISTS (SELECT 1 FROM embedding_models m WHERE m.id = model) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'no embedding model with that id';
    END IF;
    INSERT INTO documents (external_key)
    SELECT DISTINCT k FROM unnest(p_keys) AS k ORDER BY k
    ON CONFLICT (external_key) DO NOTHING;
    PERFORM 1 FROM documents d WHERE d.external_key = ANY(p_keys)
    ORDER BY d.external_key FOR UPDATE;
    -- Set-based, one statement per round: round r takes each key's r-th occurrence in the
    -- call (one round when the keys are distinct), so a key given twice is compared with the
    -- version its first occurrence made.
    FOR r IN 1 .. (SELECT coalesce(max(c), 0) FROM (SELECT count(*) AS c FROM unnest(p_keys) AS k
                                                     GROUP BY k) AS counts) LOOP
        FOR row_out IN
            WITH input AS (
                SELECT u.o::integer AS o, u.k, u.s, u.h, u.n, u.ct, u.nm, u.et,
                       row_number() OVER (PARTITION BY u.k ORDER BY u.o) AS occurrence
                FROM unnest(p_keys, p_storage_keys, p_sha256s, p_byte_sizes,
                            coalesce(p_content_types, array_fill(NULL::text, ARRAY[n])),
                            coalesce(p_original_names, array_fill(NULL::text, ARRAY[n])),
                            coalesce(p_source_etags, array_fill(NULL::text, ARRAY[n])))
                     WITH ORDINALITY AS u(k, s, h, n, ct, nm, et, o)
            ), batch AS (
                SELECT i.*, d.id AS doc FROM input i
                JOIN documents d ON d.external_key = i.k
                WHERE i.occurrence = r
            ), latest AS (
                SELECT DISTINCT ON (v.document_id) v.document_id, v.id, v.version_no, v.sha256
                FROM document_versions v WHERE v.document_id IN (SELECT b.doc FROM batch b)
                ORDER BY v.document_id, v.version_no DESC
            ), fresh AS (
                SELECT b.*, coalesce(l.version_no, 0) + 1 AS vno FROM batch b
                LEFT JOIN latest l ON l.document_id = b.doc
                WHERE l.sha256 IS DISTINCT FROM b.h
            ), new_versions AS (
                INSERT INTO document_versions
                    (document_id, version_no, storage_key, original_name, content_type,
                     byte_size, sha256, source_etag)
                SELECT f.doc, f.vno, f.s, coalesce(f.nm, regexp_replace(f.k, '^.*/', '')),
                       f.ct, f.n, f.h, f.et
                FROM fresh f ORDER BY f.o
                RETURNING id, document_id, version_no, byte_size
            ), new_jobs AS (
                INSERT INTO embedding_jobs
                    (document_version_id, embedding_model_id, max_attempts, priority)
                SELECT nv.id, model, p_max_attempts, p_priority FROM new_versions nv
                RETURNING id, document_version_id
            ), events AS (
                INSERT INTO indexing_events
                    (event_type, embedding_job_id, document_version_id, detail)
                SELECT 'JOB_ENQUEUED', nj.id, nv.id,
                       jsonb_build_object('version_no', nv.version_no, 'byte_size', nv.byte_size)
                FROM new_jobs nj JOIN new_versions nv ON nv.id = nj.document_version_id
            )
            SELECT b.o, b.k, b.doc,
                   (nv.id IS NOT NULL) AS made,
                   coalesce(nv.id, l.id) AS vid,
                   coalesce(nv.version_no, l.version_no) AS vno,
                   coalesce(nj.id, (SELECT j.id FROM embedding_jobs j
                                    WHERE j.document_version_id = l.id
                                      AND j.embedding_model_id = model)) AS jid
            FROM batch b
            LEFT JOIN latest l ON l.document_id = b.doc
            LEFT JOIN new_versions nv ON nv.document_id = b.doc
            LEFT JOIN new_jobs nj ON nj.document_version_id = nv.id
            ORDER BY b.o
        LOOP
            ord := row_out.o; document_key := row_out.k; document_id := row_out.doc;
            status := CASE WHEN row_out.made THEN 'created' ELSE 'unchanged' END;
            version_id := row_out.vid; version_no := row_out.vno; job_id := row_out.jid;
            created := created OR row_out.made;
            RETURN NEXT;
        END LOOP;
    END LOOP;
    IF created THEN
        NOTIFY trioindex_jobs;
    END IF;
END;
$$;

-- One document: trioindex_enqueue_documents for one key.
CREATE FUNCTION trioindex_enqueue_document(
    p_key text, p_storage_key text, p_sha256 text, p_byte_size bigint,
    p_content_type text DEFAULT NULL, p_original_name text DEFAULT NULL,
    p_priority integer DEFAULT 0, p_max_attempts integer DEFAULT 5)
RETURNS TABLE (status text, document_id uuid, version_id uuid, version_no integer,
               job_id uuid)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT e.status, e.document_id, e.version_id, e.version_no, e.job_id
    FROM trioindex_enqueue_documents(
        ARRAY[p_key], ARRAY[p_storage_key], ARRAY[p_sha256], ARRAY[p_byte_size],
        ARRAY[p_content_type], ARRAY[p_original_name], p_priority, p_max_attempts) AS e
$$;

-- Delete the documents named by p_keys and those whose key starts with p_prefix (an empty
-- prefix is refused: name the keys), with everything under them, in the caller's transaction;
-- with p_unchanged_since, a document that got a version at or after it is kept (decided under
-- its lock). Locks in the workers' order (jobs, versions, documents), so a worker's fenced
-- write racing the delete either commits first or finds its job gone. Returns the deleted
-- keys, the keys asked for by name that did not exist, the versions deleted, and the storage
-- keys no remaining version names (their blobs may be removed).
CREATE FUNCTION trioindex_delete_documents(
    p_keys text[], p_prefix text DEFAULT NULL, p_unchanged_since timestamptz DEFAULT NULL)
RETURNS TABLE (deleted text[], missing text[], versions integer, unreferenced_blobs text[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    ids uuid[];
    blobs text[];
BEGIN
    IF p_prefix = '' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'an empty prefix would delete every document; name the keys instead';
    END IF;
    SELECT coalesce(array_agg(d.id ORDER BY d.id), '{}') INTO ids FROM documents d
    WHERE d.external_key = ANY(coalesce(p_keys, '{}')) OR starts_with(d.external_key, p_prefix);
    missing := ARRAY(SELECT k FROM unnest(coalesce(p_keys, '{}')) AS k
                     WHERE NOT EXISTS (SELECT 1 FROM documents d WHERE d.external_key = k)
                     ORDER BY k);
    PERFORM 1 FROM embedding_jobs j JOIN document_versions v ON v.id = j.document_version_id
    WHERE v.document_id = ANY(ids) ORDER BY j.id FOR UPDATE OF j;
    PERFORM 1 FROM document_versions v WHERE v.document_id = ANY(ids) ORDER BY v.id FOR UPDATE;
    PERFORM 1 FROM documents d WHERE d.id = ANY(ids) ORDER BY d.id FOR UPDATE;
    IF p_unchanged_since IS NOT NULL THEN
        -- under the document locks: a version committed before them is seen here, one after
        -- them waits for this transaction
        ids := ARRAY(SELECT i FROM unnest(ids) AS i
                     WHERE NOT EXISTS (SELECT 1 FROM document_versions v
                                       WHERE v.document_id = i
                                         AND v.created_at >= p_unchanged_since));
    END IF;
    SELECT count(*)::integer, coalesce(array_agg(DISTINCT v.storage_key), '{}')
    INTO versions, blobs FROM document_versions v WHERE v.document_id = ANY(ids);
    WITH gone AS (DELETE FROM documents d WHERE d.id = ANY(ids) RETURNING d.external_key)
    SELECT coalesce(array_agg(g.external_key ORDER BY g.external_key), '{}') INTO deleted
    FROM gone g;
    unreferenced_blobs := ARRAY(
        SELECT b FROM unnest(blobs) AS b
        WHERE NOT EXISTS (SELECT 1 FROM document_versions v WHERE v.storage_key = b)
        ORDER BY b);
    IF cardinality(deleted) > 0 THEN
        INSERT INTO indexing_events (event_type, detail)
        VALUES ('DOCUMENTS_DELETED',
                jsonb_build_object('documents', cardinality(deleted), 'versions', versions));
    END IF;
    RETURN NEXT;
END;
$$;

-- One document by key: true when it existed (and is now deleted).
CREATE FUNCTION trioindex_delete_document(p_key text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT cardinality(d.deleted) > 0 FROM trioindex_delete_documents(ARRAY[p_key]) AS d
$$;

-- Each document's newest version as each model sees it: what an application (or a role that
-- may only read this view) needs to show indexing status. served: the model serves this
-- version; served_version_no: the version it serves (older while the newest is indexed).
CREATE VIEW trioindex_document_states AS
SELECT d.external_key AS document_key, v.version_no, v.byte_size, v.sha256,
       m.name AS model, j.status AS job_status, j.progress, j.chunk_count,
       j.last_failure_type AS failure_type, m.is_active AS model_serves_search,
       (s.document_version_id = v.id) AS served, sv.version_no AS served_version_no
FROM documents d
JOIN LATERAL (SELECT * FROM document_versions x WHERE x.document_id = d.id
              ORDER BY x.version_no DESC LIMIT 1) v ON true
JOIN embedding_jobs j ON j.document_version_id = v.id
JOIN embedding_models m ON m.id = j.embedding_model_id
LEFT JOIN served_versions s ON s.document_id = d.id AND s.embedding_model_id = m.id
LEFT JOIN document_versions sv ON sv.id = s.document_version_id;

-- PostgreSQL lets every role execute a new function; these run with their owner's rights, so
-- only roles granted EXECUTE (docs/design/integration.md) may call them.
REVOKE EXECUTE ON FUNCTION
    trioindex_enqueue_documents(text[], text[], text[], bigint[], text[], text[], integer,
                                integer, uuid, text[]),
    trioindex_enqueue_document(text, text, text, bigint, text, text, integer, integer),
    trioindex_delete_documents(text[], text, timestamptz),
    trioindex_delete_document(text)
FROM PUBLIC;

-- the steps of a job, for many claims at once ------------------------------------------------
--
-- Each function takes parallel arrays, one element per job, and returns one row per job in the
-- order given. It fences the whole group in one statement (trioindex_fence_many), checks every
-- job's own conditions in one statement, and writes the jobs that pass with one statement per
-- table: a job refused with TI001, TI002 or TI003 changes nothing and is reported in its own
-- result row (refusal, message) while the other jobs commit; any other error fails the call,
-- and the caller writes each job alone. Callers pass jobs in version-id order. A step is
-- recorded on the job's running attempt, held by the job row (its time and counts, in the
-- step's one update of the job row), not as an event; events are written for the transitions
-- an operator must see.

-- The chunk rows of the sets given, in one statement: set i (version p_versions[i] of document
-- p_docs[i], chunk set p_chunkings[i]) is elements p_first[i] .. p_first[i] + p_count[i] - 1 of
-- the c_* arrays, in chunk order (chunk_index 0, 1, ...). Returns the rows inserted. The
-- callers decide which sets are stored (fenced, checked, under their versions' locks).
-- PL/pgSQL, not SQL: its statement's plan is kept for the session, not made at every call.
CREATE FUNCTION trioindex_insert_chunk_sets(
    p_docs uuid[], p_versions uuid[], p_chunkings text[], p_first integer[], p_count integer[],
    c_ids uuid[], c_content text[], c_start integer[], c_end integer[], c_tokens integer[],
    c_sha256s text[])
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    inserted bigint;
BEGIN
    INSERT INTO document_chunks
        (id, document_id, document_version_id, chunking, chunk_index, content,
         char_start, char_end, token_count, content_sha256)
    SELECT c.id, s.doc, s.version, s.chunking, (c.k - 1)::integer, c.content,
           c.s, c.e, c.t, c.h
    FROM unnest(p_docs, p_versions, p_chunkings, p_first, p_count)
         AS s(doc, version, chunking, first, n)
    CROSS JOIN LATERAL unnest(
        c_ids[s.first : s.first + s.n - 1], c_content[s.first : s.first + s.n - 1],
        c_start[s.first : s.first + s.n - 1], c_end[s.first : s.first + s.n - 1],
        c_tokens[s.first : s.first + s.n - 1], c_sha256s[s.first : s.first + s.n - 1])
        WITH ORDINALITY AS c(id, content, s, e, t, h, k);
    GET DIAGNOSTICS inserted = ROW_COUNT;
    RETURN inserted;
END;
$$;

-- The parse step's commit and the embed step's start, for many claims: store the job's chunk
-- set (job i's chunks are elements p_first[i] .. p_first[i] + p_count[i] - 1 of the c_* arrays,
-- in chunk order), recorded on the attempt (parse_started_at, the time p_parse_started[i] the
-- claim began the parse; chunks_stored_at with chunks, characters and replaced_sequences, and
-- embedding_started_at; progress 50). The version must still match the snapshot the claim
-- read (p_versions, p_storage_keys, p_sha256s, p_byte_sizes). When the set is already stored (another
-- model's job shares it, or a repeated commit), or an earlier job of the same call stores it,
-- nothing is written for this job and started_embedding is false: the caller prepares the
-- embed step from the stored set. p_low_confidence[i] is NULL, or the pages OCR read with low
-- confidence (an integer array literal, '{1,3}'): stored on the version
-- (ocr_low_confidence_pages) with an OCR_LOW_CONFIDENCE event (pages for an operator to
-- review).
CREATE FUNCTION trioindex_store_chunks_many(
    p_jobs uuid[], p_workers uuid[], p_tokens uuid[], p_attempts uuid[],
    p_versions uuid[], p_storage_keys text[], p_sha256s text[], p_byte_sizes bigint[],
    p_replaced integer[], p_first integer[], p_count integer[],
    c_ids uuid[], c_content text[], c_start integer[], c_end integer[], c_tokens integer[],
    c_sha256s text[], p_low_confidence text[], p_parse_started timestamptz[])
RETURNS TABLE (
    job_id uuid, refusal text, message text, chunks integer, started_embedding boolean,
    model_id uuid, model_name text, dimension integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    codes text[];
    messages text[];
BEGIN
    SELECT f.codes, f.messages INTO codes, messages
    FROM trioindex_fence_many(p_jobs, p_workers, p_tokens, p_attempts) AS f;
    RETURN QUERY
    WITH given AS (
        SELECT u.*, j.chunking, j.embedding_model_id AS model, v.id AS version,
               v.document_id AS doc, m.name AS mname, m.dimension AS dim,
               (SELECT count(*) FROM document_chunks c
                WHERE c.document_version_id = v.id AND c.chunking = j.chunking)::integer
                   AS stored,
               r.code AS refused, r.message AS why
        FROM unnest(p_jobs, p_workers, p_attempts, codes, messages, p_versions, p_storage_keys,
                    p_sha256s, p_byte_sizes, p_replaced, p_first, p_count, p_low_confidence,
                    p_parse_started)
             WITH ORDINALITY AS u(job, worker, attempt, code, msg, given_version, given_key,
                                  given_sha256, given_size, replaced, first, n, low,
                                  parse_started, ord)
        LEFT JOIN embedding_jobs j ON j.id = u.job AND u.code IS NULL
        LEFT JOIN document_versions v ON v.id = j.document_version_id
        LEFT JOIN embedding_models m ON m.id = j.embedding_model_id
        CROSS JOIN LATERAL (
            SELECT x.code, x.message FROM (VALUES
                (1, u.n < 1, 'TI002', 'refusing to store an empty chunk set'),
                (2, u.code IS NOT NULL, u.code, u.msg),
                (3, v.id <> u.given_version OR v.storage_key <> u.given_key
                    OR v.sha256 <> u.given_sha256 OR v.byte_size <> u.given_size,
                 'TI002', 'the version changed since the parse began'),
                (4, m.id IS NULL, 'TI002', 'the job''s embedding model no longer exists'),
                (5, true, NULL, NULL)) AS x(rank, refused, code, message)
            WHERE x.refused ORDER BY x.rank LIMIT 1) AS r
    ), passed AS (
        SELECT g.* FROM given g WHERE g.refused IS NULL
    ), storing AS (
        -- the set is stored already (under the version lock, so never half): converge; of
        -- two jobs of this call on one set, the first stores it
        SELECT p.* FROM passed p
        WHERE p.stored = 0
          AND p.ord = (SELECT min(q.ord) FROM passed q
                       WHERE q.version = p.version AND q.chunking = p.chunking)
    ), new_chunks AS MATERIALIZED (
        -- read by the final SELECT, so it runs (a SELECT in WITH runs only when read)
        SELECT trioindex_insert_chunk_sets(
            array_agg(s.doc), array_agg(s.version), array_agg(s.chunking), array_agg(s.first),
            array_agg(s.n), c_ids, c_content, c_start, c_end, c_tokens, c_sha256s) AS stored_rows
        FROM storing s
    ), progressed AS (
        -- the step, recorded on the running attempt (on the job row): no indexed column
        UPDATE embedding_jobs j
        SET progress = 50, attempt_parse_started_at = s.parse_started,
            attempt_chunks_stored_at = now(), attempt_chunks = s.n,
            attempt_characters = c_end[s.first + s.n - 1],
            attempt_replaced_sequences = nullif(s.replaced, 0),
            attempt_embedding_started_at = now()
        FROM storing s WHERE j.id = s.job
    ), marked AS (
        UPDATE document_versions v SET ocr_low_confidence_pages = s.low::integer[]
        FROM storing s WHERE v.id = s.version AND s.low IS NOT NULL
    ), events AS (
        INSERT INTO indexing_events
            (event_type, embedding_job_id, document_version_id, attempt_id, worker_id, detail)
        SELECT 'OCR_LOW_CONFIDENCE', s.job, s.version, s.attempt, s.worker,
               jsonb_build_object('pages', s.low::integer[])
        FROM storing s WHERE s.low IS NOT NULL
        ORDER BY s.ord
    )
    SELECT g.job, g.refused, g.why,
           CASE WHEN g.refused IS NULL
                THEN coalesce(nullif(g.stored, 0),
                              (SELECT s.n FROM storing s
                               WHERE s.version = g.version AND s.chunking = g.chunking)) END,
           coalesce(g.ord IN (SELECT s.ord FROM storing s), false),
           CASE WHEN g.refused IS NULL THEN g.model END,
           CASE WHEN g.refused IS NULL THEN g.mname END,
           CASE WHEN g.refused IS NULL THEN g.dim END
    FROM given g CROSS JOIN new_chunks
    ORDER BY g.ord;
END;
$$;

-- The embed step's start from a stored chunk set (a claim whose set exists: another model's
-- job stored it, or this job's earlier attempt did): the model, progress 50 the first time,
-- and the attempt's embedding_started_at (once per attempt). existing is the number of this model's vectors already on the
-- set: 0, or all of them (a replay). A partial set (an earlier attempt stopped between the
-- slices of a large document) belongs to this job alone, which is fenced here: it is deleted
-- and embedding starts again. One job; the chunks themselves are read by the caller.
CREATE FUNCTION trioindex_begin_embedding(
    p_job uuid, p_worker uuid, p_token uuid, p_attempt uuid)
RETURNS TABLE (version_id uuid, document_id uuid, model_id uuid, model_name text,
               dimension integer, chunking text, chunks integer, existing integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    j embedding_jobs;
    v document_versions;
    m embedding_models;
BEGIN
    j := trioindex_lock_owned_job(p_job, p_worker, p_token, p_attempt);
    v := trioindex_lock_version(j.document_version_id);
    SELECT * INTO m FROM embedding_models WHERE id = j.embedding_model_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'TI002',
            MESSAGE = 'the job''s embedding model no longer exists';
    END IF;
    SELECT count(*) INTO chunks FROM document_chunks c
    WHERE c.document_version_id = v.id AND c.chunking = j.chunking;
    IF chunks = 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'TI002', MESSAGE = 'the version has no chunks to embed';
    END IF;
    SELECT count(*) INTO existing FROM embeddings e
    JOIN document_chunks c ON c.id = e.chunk_id AND c.chunking = j.chunking
    WHERE e.document_version_id = v.id AND e.embedding_model_id = m.id;
    IF existing <> 0 AND existing <> chunks THEN
        DELETE FROM embeddings e USING document_chunks c
        WHERE c.id = e.chunk_id AND c.chunking = j.chunking
          AND e.document_version_id = v.id AND e.embedding_model_id = m.id;
        existing := 0;
    END IF;
    IF j.progress < 50 OR j.attempt_embedding_started_at IS NULL THEN
        UPDATE embedding_jobs
        SET progress = greatest(progress, 50),
            attempt_embedding_started_at = coalesce(attempt_embedding_started_at, now())
        WHERE id = j.id;
    END IF;
    version_id := v.id; document_id := v.document_id; model_id := m.id; model_name := m.name;
    dimension := m.dimension; chunking := j.chunking;
    RETURN NEXT;
END;
$$;

-- The elements of p_values at the positions p_positions, in that order.
CREATE FUNCTION trioindex_pick(p_values anyarray, p_positions integer[]) RETURNS anyarray
LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY(SELECT p_values[u.i] FROM unnest(p_positions) WITH ORDINALITY AS u(i, o)
                 ORDER BY u.o)
$$;

-- The embed step's commit and the job's completion, for many claims: store a slice of job i's
-- vectors (elements p_first[i] .. p_first[i] + p_count[i] - 1 of the e_* arrays, for chunks
-- p_offsets[i] .. p_offsets[i] + p_count[i] - 1 of the job's chunk set, whose ids they must
-- name in order), recorded on the attempt (embeddings_stored_at, and embeddings and
-- embedding_slices: the vectors and slices this attempt stored); the slice that ends the set
-- completes the job in the same call (completed), so a set is served only once it is whole,
-- and the completion records that slice with the attempt's end. A small document is one
-- slice; a large one is several calls, each after the slice before it (a crash between them
-- leaves a partial set that trioindex_begin_embedding clears for the next attempt). A complete
-- set already stored (a repeated commit) is not written again (stored = false) and the job
-- still completes. A job given twice in one call (a slice and the next, or a repeat) is
-- written as if its elements came one call after the other.
CREATE FUNCTION trioindex_store_embeddings_many(
    p_jobs uuid[], p_workers uuid[], p_tokens uuid[], p_attempts uuid[],
    p_versions uuid[], p_models uuid[], p_first integer[], p_count integer[],
    p_offsets integer[], e_chunk_ids uuid[], e_vectors vector[], e_sha256s text[])
RETURNS TABLE (
    job_id uuid, refusal text, message text, stored boolean, completed boolean,
    became_current boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    codes text[];
    messages text[];
    written boolean[];
    ending boolean[];
    finished uuid[];
    currents boolean[];
    failed_code text;
    failed_message text;
    ahead integer[];
    behind integer[];
    turn integer[];
    done record;
    k integer;
    out_refusals text[];
    out_messages text[];
    out_stored boolean[];
    out_completed boolean[];
    out_current boolean[];
BEGIN
    IF cardinality(p_jobs) > (SELECT count(DISTINCT x) FROM unnest(p_jobs) AS x) THEN
        -- each job's first element first, then the rest of the call (by the same rule)
        SELECT coalesce(array_agg(t.i ORDER BY t.i) FILTER (WHERE t.n = 1), '{}'),
               coalesce(array_agg(t.i ORDER BY t.i) FILTER (WHERE t.n > 1), '{}')
        INTO ahead, behind
        FROM (SELECT u.i::integer AS i,
                     row_number() OVER (PARTITION BY u.job ORDER BY u.i) AS n
              FROM unnest(p_jobs) WITH ORDINALITY AS u(job, i)) AS t;
        FOR round IN 1 .. 2 LOOP
            turn := CASE round WHEN 1 THEN ahead ELSE behind END;
            k := 0;
            FOR done IN
                SELECT * FROM trioindex_store_embeddings_many(
                    trioindex_pick(p_jobs, turn), trioindex_pick(p_workers, turn),
                    trioindex_pick(p_tokens, turn), trioindex_pick(p_attempts, turn),
                    trioindex_pick(p_versions, turn), trioindex_pick(p_models, turn),
                    trioindex_pick(p_first, turn), trioindex_pick(p_count, turn),
                    trioindex_pick(p_offsets, turn), e_chunk_ids, e_vectors, e_sha256s)
            LOOP
                k := k + 1;
                out_refusals[turn[k]] := done.refusal;
                out_messages[turn[k]] := done.message;
                out_stored[turn[k]] := done.stored;
                out_completed[turn[k]] := done.completed;
                out_current[turn[k]] := done.became_current;
            END LOOP;
        END LOOP;
        RETURN QUERY
        SELECT p_jobs[i], out_refusals[i], out_messages[i], out_stored[i], out_completed[i],
               out_current[i]
        FROM generate_subscripts(p_jobs, 1) AS i ORDER BY i;
        RETURN;
    END IF;
    SELECT f.codes, f.messages INTO codes, messages
    FROM trioindex_fence_many(p_jobs, p_workers, p_tokens, p_attempts) AS f;
    WITH given AS (
        SELECT u.*, j.chunking, v.id AS version, v.document_id AS doc, m.name AS mname,
               m.dimension AS dim, sets.size, sets.existing, sets.matching,
               r.code AS refused, r.message AS why
        FROM unnest(p_jobs, p_workers, p_attempts, codes, messages, p_versions, p_models,
                    p_first, p_count, p_offsets)
             WITH ORDINALITY AS u(job, worker, attempt, code, msg, given_version, model, first,
                                  n, off, ord)
        LEFT JOIN embedding_jobs j ON j.id = u.job AND u.code IS NULL
        LEFT JOIN document_versions v ON v.id = j.document_version_id
        LEFT JOIN embedding_models m ON m.id = j.embedding_model_id
        LEFT JOIN LATERAL (
            SELECT
                (SELECT count(*) FROM document_chunks c
                 WHERE c.document_version_id = v.id AND c.chunking = j.chunking)::integer
                    AS size,
                (SELECT count(*) FROM embeddings e
                 JOIN document_chunks c ON c.id = e.chunk_id AND c.chunking = j.chunking
                 WHERE e.document_version_id = v.id AND e.embedding_model_id = u.model)::integer
                    AS existing,
                -- the slice's ids are the set's chunks off .. off + n - 1, in order
                (SELECT count(*) FROM unnest(e_chunk_ids[u.first : u.first + u.n - 1])
                     WITH ORDINALITY AS s(id, k)
                 JOIN document_chunks c ON c.id = s.id
                 WHERE c.document_version_id = v.id AND c.chunking = j.chunking
                   AND c.chunk_index = u.off + s.k - 1)::integer AS matching
        ) AS sets ON j.id IS NOT NULL
        CROSS JOIN LATERAL (
            SELECT x.code, x.message FROM (VALUES
                (1, u.code IS NOT NULL, u.code, u.msg),
                (2, v.id <> u.given_version OR j.embedding_model_id <> u.model, 'TI002',
                 'the job''s version or model changed since embedding began'),
                (3, u.n < 1 OR u.off < 0 OR u.off + u.n > sets.size OR sets.matching <> u.n,
                 'TI002', 'the version''s chunks changed since embedding began'),
                (4, sets.existing <> sets.size AND sets.existing <> u.off, 'TI002',
                 format('partial embedding set: %s embeddings for %s chunks, slice at %s',
                        sets.existing, sets.size, u.off)),
                (5, true, NULL, NULL)) AS x(rank, refused, code, message)
            WHERE x.refused ORDER BY x.rank LIMIT 1) AS r
    ), writing AS (
        SELECT g.* FROM given g WHERE g.refused IS NULL AND g.existing <> g.size
    ), new_vectors AS (
        INSERT INTO embeddings
            (chunk_id, document_id, document_version_id, embedding_model_id, vector,
             dimension, vector_sha256)
        SELECT e.c, w.doc, w.version, w.model, e.vec, w.dim, e.h
        FROM writing w
        CROSS JOIN LATERAL unnest(
            e_chunk_ids[w.first : w.first + w.n - 1], e_vectors[w.first : w.first + w.n - 1],
            e_sha256s[w.first : w.first + w.n - 1]) AS e(c, vec, h)
    ), recorded AS (
        -- a slice that does not end its set, on the running attempt (the job row); the
        -- completion records the one that does
        UPDATE embedding_jobs j
        SET attempt_embeddings_stored_at = now(),
            attempt_embeddings = coalesce(j.attempt_embeddings, 0) + w.n,
            attempt_embedding_slices = coalesce(j.attempt_embedding_slices, 0) + 1
        FROM writing w WHERE j.id = w.job AND w.existing + w.n <> w.size
    )
    SELECT array_agg(g.refused ORDER BY g.ord), array_agg(g.why ORDER BY g.ord),
           array_agg(g.refused IS NULL AND g.existing <> g.size ORDER BY g.ord),
           array_agg(g.refused IS NULL
                     AND g.existing + CASE WHEN g.existing <> g.size THEN g.n ELSE 0 END
                         = g.size ORDER BY g.ord)
    INTO codes, messages, written, ending
    FROM given g;
    -- fenced and locked above: complete the jobs whose set is now whole without a second
    -- fence; their slices were checked against their set, so the completion refuses none (if
    -- it did, the whole call fails: no job's slice is kept without its completion)
    SELECT coalesce(array_agg(c.job_id), '{}'), coalesce(array_agg(c.became_current), '{}'),
           min(c.refusal), min(c.message)
    INTO finished, currents, failed_code, failed_message
    FROM trioindex_complete_owned(
        ARRAY(SELECT p_jobs[i] FROM generate_subscripts(p_jobs, 1) AS i WHERE ending[i]),
        ARRAY(SELECT CASE WHEN written[i] THEN p_count[i] ELSE 0 END
              FROM generate_subscripts(p_jobs, 1) AS i WHERE ending[i])
    ) AS c;
    IF failed_code IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = failed_code, MESSAGE = failed_message;
    END IF;
    RETURN QUERY
    SELECT u.job, u.code, u.msg, coalesce(u.w, false), coalesce(u.e, false), d.current
    FROM unnest(p_jobs, codes, messages, written, ending) WITH ORDINALITY
         AS u(job, code, msg, w, e, ord)
    LEFT JOIN unnest(finished, currents) AS d(job, current) ON d.job = u.job AND u.e
    ORDER BY u.ord;
END;
$$;

-- A small document's whole store, for many claims: its chunk set, its vectors and the job's
-- completion in one call, for a document whose chunks were embedded before anything of it was
-- stored (the worker keeps the two-step path, trioindex_store_chunks_many then
-- trioindex_store_embeddings_many, for documents whose parse is worth keeping across a retry).
-- Job i's chunks are elements p_first[i] .. p_first[i] + p_count[i] - 1 of the c_* arrays, in
-- chunk order, and e_vectors / e_sha256s hold one vector per chunk at the same positions. The
-- version must still match the snapshot the claim read, and the job's model be p_models[i] of
-- dimension p_dimensions[i]. The set is stored by the first job of the call on it; a job whose
-- set is stored already (another model's job shares it), or stored by an earlier job of the
-- call, stores its vectors on those chunks when they are the same (chunk for chunk by sha256),
-- else it is refused (TI002: the next attempt embeds the stored set). Then
-- trioindex_complete_owned completes the jobs with their vectors (progress goes 0 -> 100) and
-- records the steps in the attempt row it inserts: parse_started_at, the claim's time;
-- chunks_stored_at with chunks, characters and replaced_sequences when this job stored the
-- set; embedding_started_at.
CREATE FUNCTION trioindex_store_documents_many(
    p_jobs uuid[], p_workers uuid[], p_tokens uuid[], p_attempts uuid[],
    p_versions uuid[], p_storage_keys text[], p_sha256s text[], p_byte_sizes bigint[],
    p_replaced integer[], p_first integer[], p_count integer[],
    c_ids uuid[], c_content text[], c_start integer[], c_end integer[], c_tokens integer[],
    c_sha256s text[], p_parse_started timestamptz[], p_models uuid[], p_dimensions integer[],
    e_vectors vector[], e_sha256s text[])
RETURNS TABLE (job_id uuid, refusal text, message text, became_current boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    codes text[];
    messages text[];
    kept integer[];
    kept_chunks integer[];
    kept_characters integer[];
    finished uuid[];
    currents boolean[];
    failed_code text;
    failed_message text;
BEGIN
    SELECT f.codes, f.messages INTO codes, messages
    FROM trioindex_fence_many(p_jobs, p_workers, p_tokens, p_attempts) AS f;
    WITH given AS (
        SELECT u.*, j.chunking, v.id AS version, v.document_id AS doc, m.dimension AS dim,
               c_sha256s[u.first : u.first + u.n - 1] AS hashes, sets.ids AS stored_ids,
               sets.hashes AS stored_hashes, r.code AS refused, r.message AS why
        FROM unnest(p_jobs, p_workers, p_attempts, codes, messages, p_versions, p_storage_keys,
                    p_sha256s, p_byte_sizes, p_replaced, p_parse_started, p_models,
                    p_dimensions, p_first, p_count)
             WITH ORDINALITY AS u(job, worker, attempt, code, msg, given_version, given_key,
                                  given_sha256, given_size, replaced, parse_started, model,
                                  given_dim, first, n, ord)
        LEFT JOIN embedding_jobs j ON j.id = u.job AND u.code IS NULL
        LEFT JOIN document_versions v ON v.id = j.document_version_id
        LEFT JOIN embedding_models m ON m.id = j.embedding_model_id
        LEFT JOIN LATERAL (
            SELECT array_agg(c.id ORDER BY c.chunk_index) AS ids,
                   array_agg(c.content_sha256 ORDER BY c.chunk_index) AS hashes
            FROM document_chunks c
            WHERE c.document_version_id = v.id AND c.chunking = j.chunking) AS sets
          ON j.id IS NOT NULL
        CROSS JOIN LATERAL (
            SELECT x.code, x.message FROM (VALUES
                (1, u.n < 1, 'TI002', 'refusing to store an empty chunk set'),
                (2, u.code IS NOT NULL, u.code, u.msg),
                (3, v.id <> u.given_version OR v.storage_key <> u.given_key
                    OR v.sha256 <> u.given_sha256 OR v.byte_size <> u.given_size,
                 'TI002', 'the version changed since the parse began'),
                (4, m.id IS NULL OR m.id <> u.model OR m.dimension <> u.given_dim, 'TI002',
                 'the job''s model changed since embedding began'),
                (5, sets.hashes <> c_sha256s[u.first : u.first + u.n - 1], 'TI002',
                 'the version''s chunks changed since embedding began'),
                (6, true, NULL, NULL)) AS x(rank, refused, code, message)
            WHERE x.refused ORDER BY x.rank LIMIT 1) AS r
    ), placed AS (
        -- the set's first job of the call stores it when it is not stored; the others use
        -- the chunks stored before the call, or the first one's
        SELECT g.*, first_value(g.ord) OVER set_jobs AS leader,
               first_value(g.hashes) OVER set_jobs AS leader_hashes,
               first_value(c_ids[g.first : g.first + g.n - 1]) OVER set_jobs AS leader_ids
        FROM given g WHERE g.refused IS NULL
        WINDOW set_jobs AS (PARTITION BY g.version, g.chunking ORDER BY g.ord)
    ), decided AS (
        SELECT p.*, coalesce(p.stored_ids, p.leader_ids) AS ids,
               p.stored_ids IS NULL AND p.ord = p.leader AS storing,
               CASE WHEN p.stored_ids IS NULL AND p.hashes <> p.leader_hashes THEN 'TI002' END
                   AS twin_code
        FROM placed p
    ), writing AS (
        SELECT d.* FROM decided d WHERE d.twin_code IS NULL
    ), new_chunks AS MATERIALIZED (
        -- read by the final SELECT, so it runs (a SELECT in WITH runs only when read)
        SELECT trioindex_insert_chunk_sets(
            array_agg(w.doc), array_agg(w.version), array_agg(w.chunking), array_agg(w.first),
            array_agg(w.n), c_ids, c_content, c_start, c_end, c_tokens, c_sha256s) AS stored_rows
        FROM writing w WHERE w.storing
    ), new_vectors AS (
        INSERT INTO embeddings
            (chunk_id, document_id, document_version_id, embedding_model_id, vector,
             dimension, vector_sha256)
        SELECT e.c, w.doc, w.version, w.model, e.vec, w.dim, e.h
        FROM writing w
        CROSS JOIN LATERAL unnest(
            w.ids, e_vectors[w.first : w.first + w.n - 1],
            e_sha256s[w.first : w.first + w.n - 1]) AS e(c, vec, h)
    )
    SELECT array_agg(coalesce(g.refused, d.twin_code) ORDER BY g.ord),
           array_agg(coalesce(g.why, CASE WHEN d.twin_code IS NOT NULL
                     THEN 'the version''s chunks changed since embedding began' END)
                     ORDER BY g.ord),
           coalesce(array_agg(g.ord::integer ORDER BY g.ord)
                    FILTER (WHERE g.refused IS NULL AND d.twin_code IS NULL), '{}'),
           coalesce(array_agg(CASE WHEN d.storing THEN g.n ELSE 0 END ORDER BY g.ord)
                    FILTER (WHERE g.refused IS NULL AND d.twin_code IS NULL), '{}'),
           coalesce(array_agg(c_end[g.first + g.n - 1] ORDER BY g.ord)
                    FILTER (WHERE g.refused IS NULL AND d.twin_code IS NULL), '{}')
    INTO codes, messages, kept, kept_chunks, kept_characters
    FROM given g LEFT JOIN decided d ON d.ord = g.ord CROSS JOIN new_chunks;
    -- fenced and locked above, every chunk with its vector: the completion refuses none (if
    -- it did, the whole call fails: no job's set is kept without its completion), and each
    -- set's count is the p_count it was written with, so the completion is given it
    SELECT coalesce(array_agg(c.job_id), '{}'), coalesce(array_agg(c.became_current), '{}'),
           min(c.refusal), min(c.message)
    INTO finished, currents, failed_code, failed_message
    FROM trioindex_complete_owned(
        trioindex_pick(p_jobs, kept), trioindex_pick(p_count, kept),
        trioindex_pick(p_parse_started, kept), kept_chunks, kept_characters,
        trioindex_pick(p_replaced, kept), p_counted => trioindex_pick(p_count, kept)) AS c;
    IF failed_code IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = failed_code, MESSAGE = failed_message;
    END IF;
    RETURN QUERY
    SELECT u.job, u.code, u.msg, d.current
    FROM unnest(p_jobs, codes, messages) WITH ORDINALITY AS u(job, code, msg, ord)
    LEFT JOIN unnest(finished, currents) AS d(job, current) ON d.job = u.job AND u.code IS NULL
    ORDER BY u.ord;
END;
$$;

-- completion ---------------------------------------------------------------------------------

-- Complete a claim: fence it, lock its version, then trioindex_complete_owned.
CREATE FUNCTION trioindex_complete_job(p_job uuid, p_worker uuid, p_token uuid, p_attempt uuid)
RETURNS TABLE (became_current boolean, chunks integer) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    j embedding_jobs;
    done record;
BEGIN
    j := trioindex_lock_owned_job(p_job, p_worker, p_token, p_attempt);
    PERFORM trioindex_lock_version(j.document_version_id);
    SELECT * INTO done
    FROM trioindex_complete_owned(ARRAY[p_job], ARRAY[0]);
    IF done.refusal IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = done.refusal, MESSAGE = done.message;
    END IF;
    became_current := done.became_current;
    chunks := done.chunks;
    RETURN NEXT;
END;
$$;

-- Complete a group of claims (element i: job p_jobs[i], claimed by p_workers[i] with
-- p_tokens[i] and attempt p_attempts[i]), their vectors stored before this transaction: fence
-- the group (trioindex_fence_many), then trioindex_complete_owned for the jobs it kept, one row
-- per job in the order given. A job refused by the fence or by the completion (TI001, TI002,
-- TI003) changes nothing and the others commit.
CREATE FUNCTION trioindex_complete_many(
    p_jobs uuid[], p_workers uuid[], p_tokens uuid[], p_attempts uuid[])
RETURNS TABLE (job_id uuid, refusal text, message text, became_current boolean, chunks integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    codes text[];
    messages text[];
    owned integer[];
BEGIN
    SELECT f.codes, f.messages INTO codes, messages
    FROM trioindex_fence_many(p_jobs, p_workers, p_tokens, p_attempts) AS f;
    owned := ARRAY(SELECT i FROM generate_subscripts(p_jobs, 1) AS i
                   WHERE codes[i] IS NULL ORDER BY i);
    RETURN QUERY
    SELECT u.job, coalesce(u.code, c.refusal), coalesce(u.msg, c.message), c.became_current,
           c.chunks
    FROM unnest(p_jobs, codes, messages) WITH ORDINALITY AS u(job, code, msg, ord)
    LEFT JOIN trioindex_complete_owned(
        trioindex_pick(p_jobs, owned), array_fill(0, ARRAY[cardinality(owned)])) AS c ON c.job_id = u.job AND u.code IS NULL
    ORDER BY u.ord;
END;
$$;

-- BM25's statistics of what model p_model serves when it serves version p_version: the chunks
-- with the model's vectors on the version, and their text's length in characters; the
-- completion writes them on the served row it moves. A table function of one statement, so a
-- caller's lateral join inlines it: each version's vectors looked up by the version (a join
-- from many served rows was planned as one read of the whole index when the statistics say a
-- version holds many vectors).
CREATE FUNCTION trioindex_served_statistics(p_version uuid, p_model uuid)
RETURNS TABLE (chunks integer, text_length bigint) LANGUAGE sql STABLE AS $$
    SELECT count(c.id)::integer, coalesce(sum(length(c.content)), 0)::bigint
    FROM embeddings e JOIN document_chunks c ON c.id = e.chunk_id
    WHERE e.document_version_id = p_version AND e.embedding_model_id = p_model
$$;

-- What the completion of jobs p_jobs finds (element i: p_counted[i], as for
-- trioindex_complete_owned): codes[i] / messages[i] TI002 and why when job i's chunk set does
-- not have exactly one of its model's vectors per chunk (or has no chunk), else NULL; counts[i]
-- its chunks; the models and documents of the jobs not refused. Its own function so that its
-- one statement runs on a cached generic plan (see the plans section): with the group's
-- arrays as parameters a custom plan always looked cheaper and was made on every call.
CREATE FUNCTION trioindex_completion_counts(
    p_jobs uuid[], p_counted integer[],
    OUT codes text[], OUT messages text[], OUT counts integer[], OUT model_ids uuid[],
    OUT doc_ids uuid[])
LANGUAGE plpgsql AS $$
BEGIN
    SELECT array_agg(CASE WHEN r.refused THEN 'TI002' END ORDER BY u.ord),
           array_agg(CASE WHEN r.refused THEN format('cannot complete: %s embeddings for %s chunks',
                                                      n.n_vectors, n.n_chunks) END ORDER BY u.ord),
           array_agg(n.n_chunks ORDER BY u.ord),
           coalesce(array_agg(DISTINCT j.embedding_model_id) FILTER (WHERE NOT r.refused), '{}'),
           coalesce(array_agg(DISTINCT v.document_id) FILTER (WHERE NOT r.refused), '{}')
    INTO codes, messages, counts, model_ids, doc_ids
    FROM unnest(p_jobs, p_counted) WITH ORDINALITY AS u(job, counted, ord)
    JOIN embedding_jobs j ON j.id = u.job
    JOIN document_versions v ON v.id = j.document_version_id
    CROSS JOIN LATERAL (
        -- coalesce evaluates a count only for a set its caller did not count; OFFSET 0 keeps
        -- the subquery whole, so each count runs once (flattened, every use repeated it)
        SELECT coalesce(u.counted, (SELECT count(*) FROM document_chunks c
                WHERE c.document_version_id = v.id AND c.chunking = j.chunking)::integer)
                   AS n_chunks,
               coalesce(u.counted, (SELECT count(*) FROM embeddings e
                JOIN document_chunks c ON c.id = e.chunk_id AND c.chunking = j.chunking
                WHERE e.document_version_id = v.id
                  AND e.embedding_model_id = j.embedding_model_id)::integer) AS n_vectors
        OFFSET 0) AS n
    CROSS JOIN LATERAL (
        SELECT n.n_chunks = 0 OR n.n_chunks <> n.n_vectors AS refused) AS r;
END;
$$;

-- The completion of jobs p_jobs (element i: p_stored[i] vectors of its set stored just before,
-- in this transaction, which its attempt records with its end; the attempt is the one its job
-- row runs), fenced and locked with their versions by the caller in
-- this transaction, one row per job in the order given. The steps a caller ran in the same
-- transaction are recorded in the attempt row it inserts (trioindex_ended_attempt), so the
-- job row is written once after the claim:
-- p_parse_started[i], the parse's start; p_chunks[i] > 0 chunks of the set this job stored,
-- with p_characters[i] and p_replaced[i] (NULL arrays, or 0 chunks: nothing of them). A job
-- that stored vectors without an embed step of its own begins it with this store.
-- p_counted[i], when not NULL, is the chunk count of a set whose chunks and vectors the caller
-- wrote whole in this transaction, one vector per chunk (the set's every chunk, the table's
-- unique (chunk, model) key): its chunks and vectors are not counted again.
-- A job's chunk set must have exactly one of its model's vectors per chunk, else it is
-- refused (TI002) and nothing of it changes; the others' attempt rows are inserted SUCCEEDED
-- and their jobs become SUCCEEDED
-- (with the job's chunk count), and the model's served version of each document moves to the
-- newest version completed here unless the model already serves a newer one (became_current,
-- recorded on the attempt), with BM25's statistics of the chunk set it now serves (chunks,
-- text_length). Nothing of another model changes.
CREATE FUNCTION trioindex_complete_owned(
    p_jobs uuid[], p_stored integer[],
    p_parse_started timestamptz[] DEFAULT NULL, p_chunks integer[] DEFAULT NULL,
    p_characters integer[] DEFAULT NULL, p_replaced integer[] DEFAULT NULL,
    p_counted integer[] DEFAULT NULL)
RETURNS TABLE (job_id uuid, refusal text, message text, became_current boolean, chunks integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    codes text[];
    messages text[];
    counts integer[];
    model_ids uuid[];
    doc_ids uuid[];
BEGIN
    SELECT c.codes, c.messages, c.counts, c.model_ids, c.doc_ids
    INTO codes, messages, counts, model_ids, doc_ids
    FROM trioindex_completion_counts(p_jobs, p_counted) AS c;
    -- Held to commit: trioindex_finish_switch locks the serving model's row FOR UPDATE, so it
    -- waits for this model's completions in flight before it compares what each model serves.
    -- Taken before the document rows, so a switch never waits for a document while a
    -- completion waits for it.
    PERFORM 1 FROM embedding_models WHERE id = ANY(model_ids) ORDER BY id FOR KEY SHARE;
    -- Lock the document rows on their own, then read the served versions in a new statement:
    -- a statement that waited for a lock sees only the locked row's new version, not rows it
    -- joined, so reading both in one statement could miss a newer version committed meanwhile.
    PERFORM 1 FROM documents WHERE id = ANY(doc_ids) ORDER BY id FOR UPDATE;
    RETURN QUERY
    WITH given AS (
        SELECT u.ord, u.job, u.code, u.msg, u.n_chunks, u.stored,
               j.embedding_model_id AS model, v.id AS version, v.document_id AS doc,
               v.version_no
        FROM unnest(p_jobs, codes, messages, counts, p_stored)
             WITH ORDINALITY AS u(job, code, msg, n_chunks, stored, ord)
        JOIN embedding_jobs j ON j.id = u.job
        JOIN document_versions v ON v.id = j.document_version_id
    ), finishing AS (
        SELECT g.*,
               (SELECT cur.version_no FROM served_versions s
                JOIN document_versions cur ON cur.id = s.document_version_id
                WHERE s.embedding_model_id = g.model AND s.document_id = g.doc) AS served_no,
               max(g.version_no) OVER (PARTITION BY g.model, g.doc) AS newest
        FROM given g WHERE g.code IS NULL
    ), decided AS (
        -- what a model serves only moves forward, to the newest version completed here
        SELECT f.*, (f.served_no IS NULL OR f.served_no < f.version_no)
                    AND f.version_no = f.newest AS current
        FROM finishing f
    ), served AS (
        -- the first version the model serves of a document: a plain insert, no speculative
        -- one (ON CONFLICT's probe and confirmation record). No other transaction can insert
        -- the row meanwhile: its only writer is this statement, which holds the document's
        -- row lock (taken above) and began after it was granted.
        INSERT INTO served_versions
            (document_id, embedding_model_id, document_version_id, chunks, text_length)
        SELECT d.doc, d.model, d.version, t.chunks, t.text_length
        FROM decided d
        CROSS JOIN LATERAL trioindex_served_statistics(d.version, d.model) AS t
        WHERE d.current AND d.served_no IS NULL
    ), moved AS (
        -- a served row moving to a newer version, found by its key (the conflict)
        INSERT INTO served_versions
            (document_id, embedding_model_id, document_version_id, chunks, text_length)
        SELECT d.doc, d.model, d.version, t.chunks, t.text_length
        FROM decided d
        CROSS JOIN LATERAL trioindex_served_statistics(d.version, d.model) AS t
        WHERE d.current AND d.served_no IS NOT NULL
        ON CONFLICT (embedding_model_id, document_id)
        DO UPDATE SET document_version_id = EXCLUDED.document_version_id,
                      chunks = EXCLUDED.chunks, text_length = EXCLUDED.text_length,
                      updated_at = now()
    ), attempts AS (
        -- the attempt's row, written once as it ends: the success's record (finished_at,
        -- became_current), with the steps run in this transaction; no event
        INSERT INTO embedding_job_attempts
        SELECT a.* FROM decided d
        JOIN embedding_jobs j ON j.id = d.job
        LEFT JOIN unnest(p_parse_started, p_chunks, p_characters, p_replaced)
             WITH ORDINALITY AS s(parse_started, chunks, characters, replaced, ord)
          ON s.ord = d.ord
        CROSS JOIN LATERAL trioindex_ended_attempt(
            j, 'SUCCEEDED', p_became_current => d.current, p_stored => d.stored,
            p_parse_started => s.parse_started, p_chunks => s.chunks,
            p_characters => s.characters, p_replaced => s.replaced) AS a
    ), jobs AS (
        UPDATE embedding_jobs j
        SET status = 'SUCCEEDED', progress = 100, finished_at = now(), chunk_count = d.n_chunks,
            worker_id = NULL, claim_token = NULL, locked_at = NULL, lease_expires_at = NULL,
            attempt_id = NULL, last_failure_type = NULL, last_failure_message = NULL,
            updated_at = now(),
            -- the ended attempt's steps are in its row now (written by the CTE above, which
            -- reads the job row as the statement found it)
            attempt_parse_started_at = NULL, attempt_chunks_stored_at = NULL,
            attempt_chunks = NULL, attempt_characters = NULL, attempt_replaced_sequences = NULL,
            attempt_embedding_started_at = NULL, attempt_embeddings_stored_at = NULL,
            attempt_embeddings = NULL, attempt_embedding_slices = NULL
        FROM decided d WHERE j.id = d.job
    )
    SELECT g.job, g.code, g.msg, d.current, d.n_chunks
    FROM given g LEFT JOIN decided d ON d.ord = g.ord
    ORDER BY g.ord;
END;
$$;

-- the model switch ---------------------------------------------------------------------------

-- Work the switched-to model still owes: an open job, or a job FAILED on a version newer than
-- the one the model serves for that document (retry it, or delete the document, to let the
-- switch end: finishing would serve an older version than before).
CREATE FUNCTION trioindex_switch_jobs_left(p_model uuid) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM embedding_jobs j
        JOIN document_versions v ON v.id = j.document_version_id
        LEFT JOIN served_versions s
          ON s.embedding_model_id = p_model AND s.document_id = v.document_id
        LEFT JOIN document_versions sv ON sv.id = s.document_version_id
        WHERE j.embedding_model_id = p_model
          AND (j.status IN ('PENDING', 'PROCESSING')
               OR (j.status = 'FAILED' AND coalesce(sv.version_no, 0) < v.version_no)))
$$;

-- End the model switch when the switched-to model serves, for every document the serving
-- model serves, the same version or a newer one, and owes no work: it becomes the serving
-- model in this transaction. True when it did. Called at every read of the serving model
-- (db/models.py), after a delete and after an activation; not inside a completion, whose
-- document locks it would wait for.
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
    -- from before they lock a document until they commit), then compare. The serving row
    -- first, then the new one without waiting: an ingest holds the first (its job's foreign
    -- key) while it adds the new model's twin job.
    SELECT id INTO previous FROM embedding_models WHERE is_active FOR UPDATE;
    PERFORM 1 FROM embedding_models WHERE id = target AND activating FOR UPDATE SKIP LOCKED;
    IF NOT FOUND OR trioindex_switch_jobs_left(target) THEN
        RETURN false;  -- a completion of the new model is in flight: it will check again
    END IF;
    IF EXISTS (SELECT 1 FROM served_versions a
               JOIN document_versions av ON av.id = a.document_version_id
               LEFT JOIN served_versions b
                 ON b.embedding_model_id = target AND b.document_id = a.document_id
               LEFT JOIN document_versions bv ON bv.id = b.document_version_id
               WHERE a.embedding_model_id = previous
                 AND coalesce(bv.version_no, 0) < av.version_no) THEN
        RETURN false;
    END IF;
    -- two statements: the one-active index is checked row by row
    UPDATE embedding_models SET is_active = false WHERE is_active;
    UPDATE embedding_models SET is_active = true, activating = false WHERE id = target;
    SELECT count(*) INTO documents_covered FROM served_versions
    WHERE embedding_model_id = target;
    INSERT INTO indexing_events (event_type, detail)
    VALUES ('MODEL_SWITCHED',
            jsonb_build_object('model_id', target, 'previous_model_id', previous,
                               'documents', documents_covered));
    RETURN true;
END;
$$;

-- A new job for one model gets a twin for the serving model and for the model being switched
-- to (if any), with the same budget and priority: during a switch a new version is indexed
-- for both, so neither falls behind. One statement per inserting statement (an enqueue of
-- 500 documents adds its twins in one insert); the twins' own insert does not fire it again.
CREATE FUNCTION trioindex_jobs_follow_models() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN NULL;
    END IF;
    INSERT INTO embedding_jobs (document_version_id, embedding_model_id, max_attempts, priority)
    SELECT n.document_version_id, m.id, n.max_attempts, n.priority
    FROM inserted_jobs n
    JOIN embedding_models m ON (m.is_active OR m.activating) AND m.id <> n.embedding_model_id
    WHERE n.status = 'PENDING'
    ON CONFLICT (document_version_id, embedding_model_id) DO NOTHING;
    RETURN NULL;
END;
$$;

CREATE TRIGGER follow_models AFTER INSERT ON embedding_jobs
    REFERENCING NEW TABLE AS inserted_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION trioindex_jobs_follow_models();

-- search -------------------------------------------------------------------------------------

-- The serving model's row (no row before a model is registered), read after a switch that is
-- complete has ended (trioindex_finish_switch, its own statement inside: its update is seen),
-- so the switch takes effect at the first search after it: what a search reads first, in one
-- round trip.
CREATE FUNCTION trioindex_serving_model() RETURNS SETOF embedding_models
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM trioindex_finish_switch();
    RETURN QUERY SELECT * FROM embedding_models WHERE is_active;
END;
$$;

-- Whether a version's document passes a search's filters: its key starts with p_key_prefix
-- (plain characters, no LIKE wildcards), its content type is one of p_content_types or of
-- their family (a type's part before the "/": "text"), and OCR marked it of low confidence
-- (p_low_confidence true) or did not (false). A NULL or empty filter keeps every version. One
-- SQL expression, IMMUTABLE and not STRICT, so the planner inlines it into the rankings that
-- call it (an absent filter folds to true when its value is known at planning).
CREATE FUNCTION trioindex_search_filters_pass(
    p_external_key text, p_content_type text, p_ocr_low_confidence_pages integer[],
    p_key_prefix text, p_content_types text[], p_low_confidence boolean
) RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (p_key_prefix IS NULL OR starts_with(p_external_key, p_key_prefix))
       AND (coalesce(cardinality(p_content_types), 0) = 0
            OR p_content_type = ANY(p_content_types)
            OR split_part(p_content_type, '/', 1) = ANY(p_content_types))
       AND (p_low_confidence IS NULL
            OR (p_ocr_low_confidence_pages IS NOT NULL) = p_low_confidence)
$$;

-- The sign bits of the vector expression p_vector (SQL text) of a model of p_dimension
-- dimensions, as SQL text: the expression a model's HNSW index is built on
-- (trioindex.db.vector_index.create_index_sql) and the one the ranking below orders by, one
-- text for both, since the planner uses the index only for the very expression it holds.
CREATE FUNCTION trioindex_sign_bits_sql(p_dimension integer, p_vector text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT format('binary_quantize(%2$s::vector(%1$s))::bit(%1$s)', p_dimension, p_vector)
$$;

-- The p_limit chunks of the versions p_model serves nearest p_query by cosine, best first, with
-- score = 1 - cosine distance: one statement, so one round trip (db/search.py says why the
-- ranking has this shape). Exact while the model's bit index p_index is missing or invalid;
-- once it is valid, the p_candidates nearest by the Hamming distance of their sign bits
-- (through the index, with hnsw.iterative_scan = p_iterative_scan and, unless p_ef_search is
-- NULL, hnsw.ef_search = p_ef_search, both for this transaction only) ordered by exact cosine.
-- The candidates are ranked from the vectors and the served rows alone; documents and
-- versions are read for them only when a filter is given (p_key_prefix, p_content_types,
-- p_low_confidence: trioindex_search_filters_pass says what each keeps; NULL: no filter). The
-- text, document and version are read for the p_limit kept. The dimension is written into the
-- statement: the index is on that expression.
CREATE FUNCTION trioindex_nearest_chunks(
    p_query vector, p_model uuid, p_dimension integer, p_index text, p_limit integer,
    p_candidates integer, p_ef_search integer, p_iterative_scan text,
    p_key_prefix text, p_content_types text[], p_low_confidence boolean
) RETURNS TABLE (
    chunk_id uuid, external_key text, document_id uuid, version_no integer, content_type text,
    chunk_index integer, content text, ocr_low_confidence_pages integer[],
    score double precision
) LANGUAGE plpgsql AS $$
DECLARE
    indexed boolean;
    exact text := format('e.vector::vector(%1$s) <=> $1::vector(%1$s)', p_dimension);
    filters text := '';
    nearest text;
BEGIN
    SELECT i.indisvalid INTO indexed FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid
    WHERE c.relname = p_index AND c.relnamespace = current_schema()::regnamespace;
    IF coalesce(indexed, false) THEN
        PERFORM set_config('hnsw.iterative_scan', p_iterative_scan, true);
        IF p_ef_search IS NOT NULL THEN
            PERFORM set_config('hnsw.ef_search', p_ef_search::text, true);
        END IF;
    END IF;
    -- which rows the filters read, not what they keep (trioindex_search_filters_pass says
    -- that): joined whenever a filter is given at all, so an empty one costs a join, no row
    IF num_nonnulls(p_key_prefix, p_content_types, p_low_confidence) > 0 THEN
        filters := ' AND trioindex_search_filters_pass(d.external_key, v.content_type,'
                   ' v.ocr_low_confidence_pages, $5, $6, $7)';
    END IF;
    nearest := format(
        'SELECT e.chunk_id, 1 - (%s) AS score
         FROM embeddings e
         JOIN served_versions s ON s.document_version_id = e.document_version_id
                               AND s.embedding_model_id = $2
         %s
         WHERE e.embedding_model_id = $2%s
         ORDER BY %s
         LIMIT %s',
        exact,
        CASE WHEN filters <> '' THEN 'JOIN documents d ON d.id = s.document_id
         JOIN document_versions v ON v.id = e.document_version_id' ELSE '' END,
        filters,
        CASE WHEN indexed
             THEN trioindex_sign_bits_sql(p_dimension, 'e.vector') || ' <~> '
                  || trioindex_sign_bits_sql(p_dimension, '$1')
             ELSE exact END,
        CASE WHEN indexed THEN '$4' ELSE '$3' END);
    IF indexed THEN
        nearest := format('SELECT * FROM (%s) AS n ORDER BY score DESC LIMIT $3', nearest);
    END IF;
    RETURN QUERY EXECUTE format(
        'SELECT c.id, d.external_key, d.id, v.version_no, v.content_type, c.chunk_index,
                c.content, v.ocr_low_confidence_pages, r.score
         FROM (%s) AS r
         JOIN document_chunks c ON c.id = r.chunk_id
         JOIN documents d ON d.id = c.document_id
         JOIN document_versions v ON v.id = c.document_version_id
         ORDER BY r.score DESC', nearest)
    USING p_query, p_model, p_limit, p_candidates, p_key_prefix, p_content_types,
          p_low_confidence;
END;
$$;

-- plans ----------------------------------------------------------------------------------------

-- Key lookups only. plpgsql caches a generic plan per connection after five calls; when that
-- happens while these tables are small and analysed as small, a sequential scan is the
-- cheapest plan and stays until the next analyse (measured: embedding_job_attempts and
-- document_chunks scanned thousands of times in a 2,000-job run, docs/test-results/peer.md).
-- Every statement in these functions has an index to use; the setting holds for the
-- functions they call too. The group functions join their argument arrays (a group: tens of
-- jobs, which the planner guesses at 10 rows) to the tables: only nested loops over the
-- arrays, so a statement looks up each job's rows by key instead of reading a whole index
-- (measured: every version's index entry read once per group, 2,000 per group at 2,000).
ALTER FUNCTION trioindex_lock_owned_job(uuid, uuid, uuid, uuid) SET enable_seqscan = off;
-- The claim's LIMIT is a parameter: a generic plan guesses it at a tenth of the claimable rows,
-- so under the automatic choice a custom plan always looked cheaper and was made on every call.
-- Forced generic, with only index scans and nested loops allowed: the claim index read in its
-- order, and each job picked looked up by key. With that guess, a hash join read the job
-- table's whole primary key for each claim (20,000 entries, 30-40 ms for one job, measured).
ALTER FUNCTION trioindex_claim(uuid, integer, double precision, uuid)
    SET enable_seqscan = off SET enable_bitmapscan = off SET enable_hashjoin = off
    SET enable_mergejoin = off SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION trioindex_fence_many(uuid[], uuid[], uuid[], uuid[])
    SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
    SET plan_cache_mode = force_generic_plan;
-- A group store's statements on generic plans from the first call: with the automatic choice
-- a group of one (documents arriving one at a time) got a new custom plan of its main
-- statement on every call, about 1 ms of planning a document, because the generic plan's guess
-- at the arrays' length looks dearer than one element; larger groups got the generic plan
-- after five calls (docs/test-results/sql_floor.md, "groups of one").
ALTER FUNCTION trioindex_store_chunks_many(
    uuid[], uuid[], uuid[], uuid[], uuid[], text[], text[], bigint[], integer[], integer[],
    integer[], uuid[], text[], integer[], integer[], integer[], text[], text[], timestamptz[])
    SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION trioindex_store_embeddings_many(
    uuid[], uuid[], uuid[], uuid[], uuid[], uuid[], integer[], integer[], integer[], uuid[],
    vector[], text[])
    SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION trioindex_store_documents_many(
    uuid[], uuid[], uuid[], uuid[], uuid[], text[], text[], bigint[], integer[], integer[],
    integer[], uuid[], text[], integer[], integer[], integer[], text[], timestamptz[], uuid[],
    integer[], vector[], text[])
    SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION trioindex_begin_embedding(uuid, uuid, uuid, uuid) SET enable_seqscan = off;
-- Its statements call functions over its arguments: their generic plans are the custom ones,
-- made once per connection (the custom plan of a group's call was made on every call).
ALTER FUNCTION trioindex_complete_many(uuid[], uuid[], uuid[], uuid[])
    SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
    SET plan_cache_mode = force_generic_plan;
-- The automatic choice (not the caller's forced generic plan): a generic plan of the write
-- statement made while served_versions was empty read the served row through a skip scan of
-- the (model, version) key, every served row of the model for every job (measured).
ALTER FUNCTION trioindex_complete_owned(
    uuid[], integer[], timestamptz[], integer[], integer[], integer[], integer[])
    SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
    SET plan_cache_mode = auto;
-- Key lookups of a group's jobs, versions, chunks and vectors: the generic plan is the custom
-- one without the array's length, made once per connection instead of on every call.
ALTER FUNCTION trioindex_completion_counts(uuid[], integer[])
    SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
    SET plan_cache_mode = force_generic_plan;
