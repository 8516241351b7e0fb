-- Per-model state (docs/design/state-machine.md): what differs per embedding model lives per
-- (version, model) — the job row, one per pair — or per (document, model) — served_versions.
--
-- * served_versions: which version of a document each model serves. A model's completion moves
--   its own row forward and nothing else; search reads the serving model's rows. It replaces
--   documents.current_version_id, which one model's completion moved for every model.
-- * embedding_jobs.chunk_count: the chunks (= vectors) the job's model indexed for the version.
-- * document_versions.status, chunk_count and indexed_at are dropped: a version's indexing
--   state is its jobs' (one per model), so one model's failure can no longer mark a version
--   every model shares as FAILED.
-- * indexing_workers: STARTING is gone (a worker row is written RUNNING).
--
-- Existing databases are converted in place: every model serves, per document, the newest
-- version it completed.

CREATE TABLE served_versions (
    document_id          uuid NOT NULL REFERENCES documents (id) ON DELETE CASCADE,
    embedding_model_id   uuid NOT NULL REFERENCES embedding_models (id) ON DELETE CASCADE,
    document_version_id  uuid NOT NULL,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (embedding_model_id, document_id),
    -- the served version belongs to the document
    FOREIGN KEY (document_version_id, document_id)
        REFERENCES document_versions (id, document_id) ON DELETE CASCADE,
    -- search joins a model's rows by version
    UNIQUE (embedding_model_id, document_version_id)
);
CREATE INDEX served_versions_version ON served_versions (document_version_id);
ALTER TABLE served_versions SET (fillfactor = 70);

ALTER TABLE embedding_jobs ADD COLUMN chunk_count integer CHECK (chunk_count >= 0);

UPDATE embedding_jobs j
SET chunk_count = (SELECT count(*) FROM document_chunks c
                   WHERE c.document_version_id = j.document_version_id
                     AND c.chunking = j.chunking)
WHERE j.status = 'SUCCEEDED';

INSERT INTO served_versions (document_id, embedding_model_id, document_version_id)
SELECT DISTINCT ON (v.document_id, j.embedding_model_id)
       v.document_id, j.embedding_model_id, v.id
FROM embedding_jobs j
JOIN document_versions v ON v.id = j.document_version_id
WHERE j.status = 'SUCCEEDED'
ORDER BY v.document_id, j.embedding_model_id, v.version_no DESC;

ALTER TABLE documents DROP COLUMN current_version_id;
ALTER TABLE document_versions DROP COLUMN status;
ALTER TABLE document_versions DROP COLUMN chunk_count;
ALTER TABLE document_versions DROP COLUMN indexed_at;

UPDATE indexing_workers SET status = 'RUNNING' WHERE status = 'STARTING';
ALTER TABLE indexing_workers ALTER COLUMN status SET DEFAULT 'RUNNING';
ALTER TABLE indexing_workers DROP CONSTRAINT indexing_workers_status_check;
ALTER TABLE indexing_workers ADD CONSTRAINT indexing_workers_status_check
    CHECK (status IN ('RUNNING', 'STOPPING', 'STOPPED'));

-- the functions of earlier versions read the dropped columns: functions.sql replaces them all
