-- Fewer rows per completed job: two kinds of row it wrote beside its data go.
--
-- BM25's collection statistics move onto the served row: served_versions gets the chunk count
-- and text length (in characters) of the chunk set the model serves for the document (the
-- chunks with the model's vectors on the served version), written by the completion that
-- moves the row (trioindex_complete_owned), and going with the row when a delete or a model's
-- removal takes it. The table served_text_statistics (a row per served document, kept by a
-- trigger, with its own keys) goes: one row and three key checks fewer per completion.

ALTER TABLE served_versions
    ADD COLUMN chunks       integer NOT NULL DEFAULT 0 CHECK (chunks >= 0),
    ADD COLUMN text_length  bigint NOT NULL DEFAULT 0 CHECK (text_length >= 0);

-- Counted afresh from the rows, as the trigger counted them; the served rows' own triggers
-- (updated_at, the old statistics) are not fired by this copy.
ALTER TABLE served_versions DISABLE TRIGGER USER;
UPDATE served_versions s
SET chunks = t.chunks, text_length = t.text_length
FROM (SELECT s2.embedding_model_id, s2.document_id, count(c.id)::integer AS chunks,
             coalesce(sum(length(c.content)), 0)::bigint AS text_length
      FROM served_versions s2
      JOIN embeddings e ON e.document_version_id = s2.document_version_id
                       AND e.embedding_model_id = s2.embedding_model_id
      JOIN document_chunks c ON c.id = e.chunk_id
      GROUP BY s2.embedding_model_id, s2.document_id) AS t
WHERE s.embedding_model_id = t.embedding_model_id AND s.document_id = t.document_id;
ALTER TABLE served_versions ENABLE TRIGGER USER;

-- every writer names them from now on
ALTER TABLE served_versions ALTER COLUMN chunks DROP DEFAULT,
                            ALTER COLUMN text_length DROP DEFAULT;

DROP TABLE served_text_statistics;

-- A job's claim and its success are read from its attempt row (started_at, finished_at with
-- status SUCCEEDED, and now became_current: whether the completion moved what the model
-- serves), not written as JOB_CLAIMED / JOB_SUCCEEDED events: two event rows fewer per job.
-- The events of earlier attempts are folded into their attempts and deleted.
ALTER TABLE embedding_job_attempts ADD COLUMN became_current boolean;

UPDATE embedding_job_attempts a
SET became_current = (e.detail ->> 'became_current')::boolean
FROM indexing_events e
WHERE e.attempt_id = a.id AND e.event_type = 'JOB_SUCCEEDED' AND a.status = 'SUCCEEDED';

DELETE FROM indexing_events WHERE event_type IN ('JOB_CLAIMED', 'JOB_SUCCEEDED');
