-- Group commit (issue 13): the worker's committer writes the finished steps of many jobs in one
-- transaction and one round trip. Each function takes parallel arrays, one element per job, and
-- handles every job in its own subtransaction (a plpgsql block with an EXCEPTION clause):
--
--   * every job is fenced on its own by trioindex_lock_owned_job (migration 0002);
--   * a job refused with TI001 (ownership lost), TI002 (state inconsistent) or TI003 (the job is
--     gone: migration 0006) changes nothing and is reported in its own result row (refusal,
--     message); the other jobs still commit;
--   * any other error (a constraint, the server) fails the whole call, and the caller retries
--     each job alone, so one job's failure never decides another's.
--
-- Jobs are handled in the order given; the caller sorts them by version id, so two groups never
-- wait on each other's version locks in opposite orders. Events carry ids and counts only.

-- Version transitions as functions, each written once: UPLOADED -> PARSING (the parse prepare,
-- below) and -> EMBEDDING (the chunk commit below, and one job's embed prepare in Python,
-- db/versions.py mark_embedding).
CREATE FUNCTION trioindex_mark_parsing(p_version uuid) RETURNS void LANGUAGE sql AS $$
    UPDATE document_versions SET status = 'PARSING' WHERE id = p_version;
$$;

-- CHUNKED or PARSING -> EMBEDDING; p_chunk_count (when not NULL) records the chunks just stored.
CREATE FUNCTION trioindex_mark_embedding(p_version uuid, p_chunk_count integer)
RETURNS void LANGUAGE sql AS $$
    UPDATE document_versions
    SET status = 'EMBEDDING', chunk_count = coalesce(p_chunk_count, chunk_count)
    WHERE id = p_version;
$$;

-- The parse step's prepare, for many claims: UPLOADED -> PARSING (PARSING_STARTED, progress 10)
-- and a snapshot of what to read. A version already CHUNKED or later is a replay (no change);
-- a FAILED version is refused with TI002.
CREATE FUNCTION trioindex_begin_parse_many(
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
            ELSIF v.status IN ('CHUNKED', 'EMBEDDING', 'INDEXED') AND v.chunk_count IS NULL THEN
                SELECT count(*) INTO v.chunk_count
                FROM document_chunks c WHERE c.document_version_id = v.id;
            END IF;
            version_id := v.id; document_id := v.document_id; storage_key := v.storage_key;
            original_name := v.original_name; content_type := v.content_type;
            byte_size := v.byte_size; sha256 := v.sha256; status := v.status;
            chunk_count := v.chunk_count;
        EXCEPTION WHEN SQLSTATE 'TI001' OR SQLSTATE 'TI002' OR SQLSTATE 'TI003' THEN
            refusal := SQLSTATE; message := SQLERRM;
        END;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- The parse step's commit and the embed step's prepare, for many claims, in one go: replace the
-- version's chunks (job i's chunks are elements p_first[i] .. p_first[i] + p_count[i] - 1 of the
-- c_* arrays, in chunk order), then PARSING -> EMBEDDING with CHUNKS_STORED and
-- EMBEDDING_STARTED (progress 50). The version must still match the snapshot the parse was
-- prepared from. A version already CHUNKED or later is a replay: nothing is written and
-- started_embedding is false (the caller then prepares the embed step on its own).
CREATE FUNCTION trioindex_store_chunks_many(
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
            IF v.status IN ('CHUNKED', 'EMBEDDING', 'INDEXED') THEN
                -- a concurrent or repeated commit for this claim got here first: converge
                SELECT count(*) INTO chunks FROM document_chunks c WHERE c.document_version_id = v.id;
            ELSIF v.status <> 'PARSING' THEN
                RAISE EXCEPTION USING ERRCODE = 'TI002',
                    MESSAGE = format('cannot store chunks: version is %s, expected PARSING', v.status);
            ELSE
                first_i := p_first[i];
                last_i := p_first[i] + p_count[i] - 1;
                DELETE FROM document_chunks c WHERE c.document_version_id = v.id;
                INSERT INTO document_chunks
                    (id, document_id, document_version_id, chunk_index, content, char_start,
                     char_end, token_count, content_sha256)
                SELECT u.id, v.document_id, v.id, (u.ord - 1)::integer, u.content, u.s, u.e, u.t,
                       u.h
                FROM unnest(c_ids[first_i:last_i], c_content[first_i:last_i],
                            c_start[first_i:last_i], c_end[first_i:last_i],
                            c_tokens[first_i:last_i], c_sha256s[first_i:last_i])
                     WITH ORDINALITY AS u(id, content, s, e, t, h, ord);
                chunks := p_count[i];
                PERFORM trioindex_mark_embedding(v.id, chunks);
                UPDATE embedding_jobs SET progress = 50 WHERE id = j.id;
                detail := jsonb_build_object('chunks', chunks, 'characters', c_end[last_i]);
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

-- The embed step's commit and the job's completion, for many claims: store every vector of the
-- version (job i's are elements p_first[i] .. p_first[i] + p_count[i] - 1 of the e_* arrays, in
-- chunk order, and their chunk ids must be exactly the version's chunks in order) with
-- EMBEDDINGS_STORED, then trioindex_complete_job (migration 0003) in the same subtransaction:
-- the vectors and the completion of a job are stored together or not at all (so no progress 90
-- is written: no reader could ever see it before the completion's 100). A complete set
-- already stored (a repeated commit) is not written again (stored = false) and the job still
-- completes.
CREATE FUNCTION trioindex_store_embeddings_many(
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
            IF p_count[i] < 1 OR ARRAY(SELECT c.id FROM document_chunks c
                                       WHERE c.document_version_id = v.id
                                       ORDER BY c.chunk_index)
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
            SELECT c.became_current INTO became_current
            FROM trioindex_complete_job(p_jobs[i], p_workers[i], p_tokens[i], p_attempts[i]) c;
        EXCEPTION WHEN SQLSTATE 'TI001' OR SQLSTATE 'TI002' OR SQLSTATE 'TI003' THEN
            refusal := SQLSTATE; message := SQLERRM;
            stored := false; became_current := NULL;
        END;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- Room on each page for a row's next version, so that an update touching no indexed column
-- (progress, a version's chunk count, a document's current version) is a HOT update: no new
-- entry in every index of the table. A job row is updated four to six times in its life.
ALTER TABLE embedding_jobs SET (fillfactor = 50);
ALTER TABLE document_versions SET (fillfactor = 70);
ALTER TABLE documents SET (fillfactor = 70);
