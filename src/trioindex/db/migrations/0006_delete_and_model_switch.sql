-- Deleting documents and switching the embedding model: the tables and indexes they need (the
-- switch itself and the fence's TI003 for a removed job are in functions.sql).
-- embedding_models.activating marks the one model being switched to.

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
