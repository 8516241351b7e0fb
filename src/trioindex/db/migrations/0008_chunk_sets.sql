-- Chunk sets (issue 14): a version keeps one set of chunks per chunking, so a model whose
-- chunking differs (token-aware chunking cuts by the model's own tokenizer) re-chunks the
-- version for itself without touching the chunks another model serves from.
--
-- document_chunks.chunking names the set: 'characters' for character chunking, which every
-- model without a tokenizer shares, or 'tokens:<model name>' for token-aware chunking with that
-- model's tokenizer. Chunks stored before this migration are taken as 'characters' (the
-- default): a deployment that ran a local token-aware model keeps serving them, and a model
-- switch to a character-chunking model reuses them.
--
-- A worker records its chunking on its row (indexing_workers.chunking); a claim copies it onto
-- the job (embedding_jobs.chunking), and every fenced write of the job reads and writes only
-- that set: the parse commit stores it, the embed commit checks its vectors against it, the
-- completion counts it. A claim also says whether the set exists yet (the claim statement in
-- db/jobs.py): a job of a new model whose set is missing parses the version's file again, even
-- if the version is already INDEXED for another model, and stores its own set beside the
-- other; the version's status does not move back.
--
-- Search ranks a model's chunks only: the vector ranking through its embeddings, the text
-- ranking by chunks that have one of its vectors (trioindex.search.ranking).

ALTER TABLE document_chunks ADD COLUMN chunking text NOT NULL DEFAULT 'characters';
ALTER TABLE document_chunks DROP CONSTRAINT document_chunks_document_version_id_chunk_index_key;
ALTER TABLE document_chunks
    ADD CONSTRAINT document_chunks_set_index UNIQUE (document_version_id, chunking, chunk_index);

ALTER TABLE indexing_workers ADD COLUMN chunking text NOT NULL DEFAULT 'characters';
ALTER TABLE embedding_jobs ADD COLUMN chunking text NOT NULL DEFAULT 'characters';

-- The parse step's prepare (0005), now per chunk set: chunk_count is the job's own set's size
-- when the version is CHUNKED or later and the set exists, NULL when it must still be made.
CREATE OR REPLACE FUNCTION trioindex_begin_parse_many(
    p_jobs uuid[], p_workers uuid[], p_tokens uuid[], p_attempts uuid[])
RETURNS TABLE (
    job_id uuid, refusal text, message text, version_id uuid, document_id uuid,
    storage_key text, original_name text, content_type text, byte_size bigint, sha256 text,
    status text, chunk_count integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    j embedding_jobs;
    v document_versions;
    n integer;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_jobs, 1), 0) LOOP
        job_id := p_jobs[i];
        refusal := NULL; message := NULL; version_id := NULL; document_id := NULL;
        storage_key := NULL; original_name := NULL; content_type := NULL; byte_size := NULL;
        sha256 := NULL; status := NULL; chunk_count := NULL;
        BEGIN
            j := trioindex_lock_owned_job(p_jobs[i], p_workers[i], p_tokens[i], p_attempts[i]);
            SELECT * INTO v FROM document_versions WHERE id = j.document_version_id FOR UPDATE;
            IF NOT FOUND THEN
                RAISE EXCEPTION USING ERRCODE = 'TI002',
                    MESSAGE = 'the job''s document version does not exist';
            END IF;
            IF v.status = 'FAILED' THEN
                RAISE EXCEPTION USING ERRCODE = 'TI002',
                    MESSAGE = 'the version is FAILED; retry the job to parse it again';
            END IF;
            IF v.status = 'UPLOADED' THEN
                PERFORM trioindex_mark_parsing(v.id);
                UPDATE embedding_jobs SET progress = 10 WHERE id = j.id;
                INSERT INTO indexing_events
                    (event_type, embedding_job_id, document_version_id, attempt_id, worker_id)
                VALUES ('PARSING_STARTED', j.id, v.id, p_attempts[i], p_workers[i]);
                v.status := 'PARSING';
            ELSIF v.status IN ('CHUNKED', 'EMBEDDING', 'INDEXED') THEN
                SELECT count(*) INTO n FROM document_chunks c
                WHERE c.document_version_id = v.id AND c.chunking = j.chunking;
                chunk_count := nullif(n, 0);
            END IF;
            version_id := v.id; document_id := v.document_id; storage_key := v.storage_key;
            original_name := v.original_name; content_type := v.content_type;
            byte_size := v.byte_size; sha256 := v.sha256; status := v.status;
        EXCEPTION WHEN SQLSTATE 'TI001' OR SQLSTATE 'TI002' OR SQLSTATE 'TI003' THEN
            refusal := SQLSTATE; message := SQLERRM;
        END;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- The parse commit and the embed prepare (0005), now per chunk set:
--   * PARSING: replace the job's set, then PARSING -> EMBEDDING (the first set of a version);
--   * CHUNKED or later without the job's set: store it beside the others (a model with its own
--     chunking, or the twin job of a switch); CHUNKED moves to EMBEDDING, a later status stays;
--   * CHUNKED or later with the job's set: a replay, nothing written (started_embedding false).
CREATE OR REPLACE FUNCTION trioindex_store_chunks_many(
    p_jobs uuid[], p_workers uuid[], p_tokens uuid[], p_attempts uuid[],
    p_versions uuid[], p_storage_keys text[], p_sha256s text[], p_byte_sizes bigint[],
    p_replaced integer[], p_first integer[], p_count integer[],
    c_ids uuid[], c_content text[], c_start integer[], c_end integer[], c_tokens integer[],
    c_sha256s text[])
RETURNS TABLE (
    job_id uuid, refusal text, message text, chunks integer, started_embedding boolean,
    model_id uuid, model_name text, dimension integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    j embedding_jobs;
    v document_versions;
    m embedding_models;
    first_i integer;
    last_i integer;
    stored integer;
    detail jsonb;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_jobs, 1), 0) LOOP
        job_id := p_jobs[i];
        refusal := NULL; message := NULL; chunks := NULL; started_embedding := false;
        model_id := NULL; model_name := NULL; dimension := NULL;
        BEGIN
            IF p_count[i] < 1 THEN
                RAISE EXCEPTION USING ERRCODE = 'TI002',
                    MESSAGE = 'refusing to store an empty chunk set';
            END IF;
            j := trioindex_lock_owned_job(p_jobs[i], p_workers[i], p_tokens[i], p_attempts[i]);
            SELECT * INTO v FROM document_versions WHERE id = j.document_version_id FOR UPDATE;
            IF NOT FOUND OR v.id <> p_versions[i] OR v.storage_key <> p_storage_keys[i]
               OR v.sha256 <> p_sha256s[i] OR v.byte_size <> p_byte_sizes[i] THEN
                RAISE EXCEPTION USING ERRCODE = 'TI002',
                    MESSAGE = 'the version changed since parsing was prepared';
            END IF;
            SELECT * INTO m FROM embedding_models WHERE id = j.embedding_model_id;
            IF NOT FOUND THEN
                RAISE EXCEPTION USING ERRCODE = 'TI002',
                    MESSAGE = 'the job''s embedding model no longer exists';
            END IF;
            model_id := m.id; model_name := m.name; dimension := m.dimension;
            IF v.status NOT IN ('PARSING', 'CHUNKED', 'EMBEDDING', 'INDEXED') THEN
                RAISE EXCEPTION USING ERRCODE = 'TI002',
                    MESSAGE = format('cannot store chunks: version is %s, expected PARSING', v.status);
            END IF;
            stored := 0;
            IF v.status <> 'PARSING' THEN
                SELECT count(*) INTO stored FROM document_chunks c
                WHERE c.document_version_id = v.id AND c.chunking = j.chunking;
            END IF;
            IF stored > 0 THEN
                -- a concurrent or repeated commit for this set got here first: converge
                chunks := stored;
            ELSE
                first_i := p_first[i];
                last_i := p_first[i] + p_count[i] - 1;
                DELETE FROM document_chunks c
                WHERE c.document_version_id = v.id AND c.chunking = j.chunking;
                INSERT INTO document_chunks
                    (id, document_id, document_version_id, chunking, chunk_index, content,
                     char_start, char_end, token_count, content_sha256)
                SELECT u.id, v.document_id, v.id, j.chunking, (u.ord - 1)::integer, u.content,
                       u.s, u.e, u.t, u.h
                FROM unnest(c_ids[first_i:last_i], c_content[first_i:last_i],
                            c_start[first_i:last_i], c_end[first_i:last_i],
                            c_tokens[first_i:last_i], c_sha256s[first_i:last_i])
                     WITH ORDINALITY AS u(id, content, s, e, t, h, ord);
                chunks := p_count[i];
                IF v.status = 'PARSING' THEN
                    PERFORM trioindex_mark_embedding(v.id, chunks);
                ELSIF v.status = 'CHUNKED' THEN
                    PERFORM trioindex_mark_embedding(v.id, NULL);
                END IF;
                UPDATE embedding_jobs SET progress = 50 WHERE id = j.id;
                detail := jsonb_build_object('chunks', chunks, 'characters', c_end[last_i],
                                             'chunking', j.chunking);
                IF p_replaced[i] > 0 THEN
                    detail := detail || jsonb_build_object('replaced_sequences', p_replaced[i]);
                END IF;
                INSERT INTO indexing_events
                    (event_type, embedding_job_id, document_version_id, attempt_id, worker_id,
                     detail)
                VALUES ('CHUNKS_STORED', j.id, v.id, p_attempts[i], p_workers[i], detail),
                       ('EMBEDDING_STARTED', j.id, v.id, p_attempts[i], p_workers[i],
                        jsonb_build_object('chunks', chunks, 'model', m.name));
                started_embedding := true;
            END IF;
        EXCEPTION WHEN SQLSTATE 'TI001' OR SQLSTATE 'TI002' OR SQLSTATE 'TI003' THEN
            refusal := SQLSTATE; message := SQLERRM;
            chunks := NULL; started_embedding := false;
        END;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- The job's chunk set in chunk order: what its vectors must match, one for one.
CREATE FUNCTION trioindex_chunk_set(p_version uuid, p_chunking text)
RETURNS uuid[] LANGUAGE sql STABLE AS $$
    SELECT ARRAY(SELECT c.id FROM document_chunks c
                 WHERE c.document_version_id = p_version AND c.chunking = p_chunking
                 ORDER BY c.chunk_index)
$$;

-- The embed commit and the completion (0005), with the vectors checked against the job's set.
CREATE OR REPLACE FUNCTION trioindex_store_embeddings_many(
    p_jobs uuid[], p_workers uuid[], p_tokens uuid[], p_attempts uuid[],
    p_versions uuid[], p_models uuid[], p_first integer[], p_count integer[],
    e_chunk_ids uuid[], e_vectors vector[], e_sha256s text[])
RETURNS TABLE (
    job_id uuid, refusal text, message text, stored boolean, became_current boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    j embedding_jobs;
    v document_versions;
    m embedding_models;
    first_i integer;
    last_i integer;
    existing integer;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_jobs, 1), 0) LOOP
        job_id := p_jobs[i];
        refusal := NULL; message := NULL; stored := false; became_current := NULL;
        BEGIN
            j := trioindex_lock_owned_job(p_jobs[i], p_workers[i], p_tokens[i], p_attempts[i]);
            SELECT * INTO v FROM document_versions WHERE id = j.document_version_id FOR UPDATE;
            IF NOT FOUND OR v.id <> p_versions[i] OR j.embedding_model_id <> p_models[i] THEN
                RAISE EXCEPTION USING ERRCODE = 'TI002',
                    MESSAGE = 'the job''s version or model changed since embedding began';
            END IF;
            -- INDEXED: a version another model already serves, embedded for a new model
            -- (migration 0006's switch), or a replay that converges on the stored set
            IF v.status NOT IN ('EMBEDDING', 'INDEXED') THEN
                RAISE EXCEPTION USING ERRCODE = 'TI002',
                    MESSAGE = format('cannot store embeddings: version is %s, expected EMBEDDING',
                                     v.status);
            END IF;
            first_i := p_first[i];
            last_i := p_first[i] + p_count[i] - 1;
            IF p_count[i] < 1 OR trioindex_chunk_set(v.id, j.chunking)
                                 IS DISTINCT FROM e_chunk_ids[first_i:last_i] THEN
                RAISE EXCEPTION USING ERRCODE = 'TI002',
                    MESSAGE = 'the version''s chunks changed since embedding began';
            END IF;
            SELECT count(*) INTO existing FROM embeddings e
            WHERE e.document_version_id = v.id AND e.embedding_model_id = p_models[i];
            IF existing > 0 AND existing <> p_count[i] THEN
                RAISE EXCEPTION USING ERRCODE = 'TI002',
                    MESSAGE = format('partial embedding set: %s embeddings for %s chunks',
                                     existing, p_count[i]);
            END IF;
            IF existing = 0 THEN
                SELECT * INTO m FROM embedding_models WHERE id = p_models[i];
                INSERT INTO embeddings
                    (chunk_id, document_id, document_version_id, embedding_model_id, vector,
                     dimension, vector_sha256)
                SELECT u.c, v.document_id, v.id, m.id, u.vec, m.dimension, u.h
                FROM unnest(e_chunk_ids[first_i:last_i], e_vectors[first_i:last_i],
                            e_sha256s[first_i:last_i]) AS u(c, vec, h);
                INSERT INTO indexing_events
                    (event_type, embedding_job_id, document_version_id, attempt_id, worker_id,
                     detail)
                VALUES ('EMBEDDINGS_STORED', j.id, v.id, p_attempts[i], p_workers[i],
                        jsonb_build_object('embeddings', p_count[i], 'model', m.name));
                stored := true;
            END IF;
            -- the job was fenced above, in this subtransaction: complete it without a second
            -- fence (nothing since then waited on anything but this transaction's own locks)
            SELECT c.became_current INTO became_current
            FROM trioindex_complete_owned(j, p_workers[i], p_attempts[i]) c;
        EXCEPTION WHEN SQLSTATE 'TI001' OR SQLSTATE 'TI002' OR SQLSTATE 'TI003' THEN
            refusal := SQLSTATE; message := SQLERRM;
            stored := false; became_current := NULL;
        END;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- The completion (0006), in two: trioindex_complete_job fences the claim, then
-- trioindex_complete_owned completes the job it locked. The group commit of vectors
-- (trioindex_store_embeddings_many) fences the job once and calls the second directly, in the
-- same subtransaction, instead of fencing it twice. It now counts the job's own chunk set and
-- the vectors on it.
CREATE OR REPLACE FUNCTION trioindex_complete_job(
    p_job uuid, p_worker uuid, p_token uuid, p_attempt uuid)
RETURNS TABLE (became_current boolean, chunks integer) LANGUAGE plpgsql AS $$
DECLARE
    j embedding_jobs;
BEGIN
    -- lock order: job, then version, then document
    j := trioindex_lock_owned_job(p_job, p_worker, p_token, p_attempt);
    RETURN QUERY SELECT * FROM trioindex_complete_owned(j, p_worker, p_attempt);
END;
$$;

-- The completion of job j, which the caller has fenced and locked in this transaction
-- (trioindex_lock_owned_job); p_worker and p_attempt are the claim's, as fenced.
CREATE FUNCTION trioindex_complete_owned(j embedding_jobs, p_worker uuid, p_attempt uuid)
RETURNS TABLE (became_current boolean, chunks integer) LANGUAGE plpgsql AS $$
DECLARE
    v document_versions;
    n_chunks integer;
    n_vectors integer;
    current_no integer;
    attempt integer;
    serves boolean;
BEGIN
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
    SELECT count(*) INTO n_chunks FROM document_chunks
    WHERE document_version_id = v.id AND chunking = j.chunking;
    SELECT count(*) INTO n_vectors FROM embeddings e
    JOIN document_chunks c ON c.id = e.chunk_id AND c.chunking = j.chunking
    WHERE e.document_version_id = v.id AND e.embedding_model_id = j.embedding_model_id;
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
    WHERE id = j.id;
    INSERT INTO indexing_events
        (event_type, embedding_job_id, document_version_id, attempt_id, worker_id, detail)
    VALUES ('JOB_SUCCEEDED', j.id, v.id, p_attempt, p_worker,
            jsonb_build_object('attempt_no', attempt, 'chunks', n_chunks,
                               'became_current', became_current));
    chunks := n_chunks;
    RETURN NEXT;
END;
$$;

-- Key lookups only. plpgsql caches a generic plan per connection after five calls; when that
-- happens while these tables are small and analysed as small, a sequential scan is the
-- cheapest plan and stays until the next analyse (measured: embedding_job_attempts and
-- document_chunks scanned thousands of times in a 2,000-job run, docs/test-results/peer.md).
-- Every statement in these functions has an index to use; the setting holds for the
-- functions they call too.
ALTER FUNCTION trioindex_lock_owned_job(uuid, uuid, uuid, uuid) SET enable_seqscan = off;
ALTER FUNCTION trioindex_begin_parse_many(uuid[], uuid[], uuid[], uuid[]) SET enable_seqscan = off;
ALTER FUNCTION trioindex_store_chunks_many(
    uuid[], uuid[], uuid[], uuid[], uuid[], text[], text[], bigint[], integer[], integer[],
    integer[], uuid[], text[], integer[], integer[], integer[], text[]) SET enable_seqscan = off;
ALTER FUNCTION trioindex_store_embeddings_many(
    uuid[], uuid[], uuid[], uuid[], uuid[], uuid[], integer[], integer[], uuid[], vector[],
    text[]) SET enable_seqscan = off;
ALTER FUNCTION trioindex_complete_owned(embedding_jobs, uuid, uuid) SET enable_seqscan = off;
