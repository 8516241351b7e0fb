-- trioindex schema, version 1: every table (described in docs/design/schema.md).
-- Status values, failure types and state/column agreement are check constraints so that no code
-- path (ours or an operator's psql session) can store a row the lifecycle does not know.

CREATE EXTENSION IF NOT EXISTS vector;


CREATE TABLE embedding_models (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name        text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 200),
    dimension   integer NOT NULL CHECK (dimension BETWEEN 1 AND 16000),
    distance    text NOT NULL DEFAULT 'cosine' CHECK (distance IN ('cosine')),
    is_active   boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    -- target of the (model, dimension) foreign key on embeddings
    UNIQUE (id, dimension)
);
-- at most one active model
CREATE UNIQUE INDEX embedding_models_one_active ON embedding_models ((true)) WHERE is_active;

CREATE TABLE documents (
    id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    external_key        text NOT NULL UNIQUE CHECK (length(external_key) BETWEEN 1 AND 1024),
    current_version_id  uuid,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE document_versions (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    document_id     uuid NOT NULL REFERENCES documents (id) ON DELETE CASCADE,
    version_no      integer NOT NULL CHECK (version_no >= 1),
    storage_key     text NOT NULL CHECK (length(storage_key) BETWEEN 1 AND 1024),
    original_name   text NOT NULL,
    content_type    text,
    byte_size       bigint NOT NULL CHECK (byte_size >= 0),
    sha256          text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    status          text NOT NULL DEFAULT 'UPLOADED'
                    CHECK (status IN ('UPLOADED', 'PARSING', 'CHUNKED', 'EMBEDDING', 'INDEXED', 'FAILED')),
    chunk_count     integer CHECK (chunk_count >= 0),
    indexed_at      timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (document_id, version_no),
    UNIQUE (id, document_id)
);

-- the current version must be a version of the same document
ALTER TABLE documents
    ADD CONSTRAINT documents_current_version_fk
    FOREIGN KEY (current_version_id, id) REFERENCES document_versions (id, document_id);

CREATE TABLE document_chunks (
    id                   uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    document_id          uuid NOT NULL,
    document_version_id  uuid NOT NULL,
    chunk_index          integer NOT NULL CHECK (chunk_index >= 0),
    content              text NOT NULL,
    char_start           integer NOT NULL CHECK (char_start >= 0),
    char_end             integer NOT NULL,
    token_count          integer NOT NULL CHECK (token_count >= 0),
    content_sha256       text NOT NULL CHECK (content_sha256 ~ '^[0-9a-f]{64}$'),
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    CHECK (char_end >= char_start),
    UNIQUE (document_version_id, chunk_index),
    UNIQUE (id, document_version_id, document_id),
    FOREIGN KEY (document_version_id, document_id)
        REFERENCES document_versions (id, document_id) ON DELETE CASCADE
);

CREATE TABLE embeddings (
    id                   uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    chunk_id             uuid NOT NULL,
    document_id          uuid NOT NULL,
    document_version_id  uuid NOT NULL,
    embedding_model_id   uuid NOT NULL,
    vector               vector NOT NULL,
    dimension            integer NOT NULL,
    vector_sha256        text NOT NULL CHECK (vector_sha256 ~ '^[0-9a-f]{64}$'),
    status               text NOT NULL DEFAULT 'ACTIVE' CHECK (status IN ('ACTIVE')),
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    CHECK (vector_dims(vector) = dimension),
    -- the last line of defence against duplicate vectors
    UNIQUE (chunk_id, embedding_model_id),
    -- denormalised ids must agree with the chunk they belong to
    FOREIGN KEY (chunk_id, document_version_id, document_id)
        REFERENCES document_chunks (id, document_version_id, document_id) ON DELETE CASCADE,
    -- and the dimension with the model
    FOREIGN KEY (embedding_model_id, dimension) REFERENCES embedding_models (id, dimension)
);
CREATE INDEX embeddings_version_model ON embeddings (document_version_id, embedding_model_id);

CREATE TABLE indexing_workers (
    id                 uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    hostname           text NOT NULL,
    pid                integer NOT NULL,
    version            text NOT NULL,
    status             text NOT NULL DEFAULT 'STARTING'
                       CHECK (status IN ('STARTING', 'RUNNING', 'STOPPING', 'STOPPED')),
    max_concurrency    integer NOT NULL CHECK (max_concurrency >= 1),
    started_at         timestamptz NOT NULL DEFAULT now(),
    last_heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    stopped_at         timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CHECK ((status = 'STOPPED') = (stopped_at IS NOT NULL))
);

CREATE TABLE embedding_jobs (
    id                    uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    document_version_id   uuid NOT NULL REFERENCES document_versions (id) ON DELETE CASCADE,
    embedding_model_id    uuid NOT NULL REFERENCES embedding_models (id),
    status                text NOT NULL DEFAULT 'PENDING'
                          CHECK (status IN ('PENDING', 'PROCESSING', 'SUCCEEDED', 'FAILED')),
    priority              integer NOT NULL DEFAULT 0,
    attempt_count         integer NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    max_attempts          integer NOT NULL CHECK (max_attempts >= 1),
    available_at          timestamptz NOT NULL DEFAULT now(),
    worker_id             uuid REFERENCES indexing_workers (id),
    claim_token           uuid,
    locked_at             timestamptz,
    lease_expires_at      timestamptz,
    progress              smallint NOT NULL DEFAULT 0 CHECK (progress BETWEEN 0 AND 100),
    last_failure_type     text CHECK (last_failure_type IN (
                              'STORAGE_UNAVAILABLE', 'DOCUMENT_CONTENT_INVALID',
                              'EMBEDDING_PROVIDER_UNAVAILABLE', 'EMBEDDING_RESULT_INVALID',
                              'INDEXING_STATE_INCONSISTENT', 'WORKER_INTERNAL_ERROR')),
    last_failure_message  text CHECK (length(last_failure_message) <= 500),
    finished_at           timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    -- one job per (version, model)
    UNIQUE (document_version_id, embedding_model_id),
    CHECK (attempt_count <= max_attempts),
    -- a PENDING job always has an attempt left to start
    CHECK (status <> 'PENDING' OR attempt_count < max_attempts),
    -- a claim is exactly the four claim columns, present only while PROCESSING
    CHECK ((status = 'PROCESSING') = (worker_id IS NOT NULL AND claim_token IS NOT NULL
                                      AND locked_at IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CHECK (status = 'PROCESSING' OR (worker_id IS NULL AND claim_token IS NULL
                                     AND locked_at IS NULL AND lease_expires_at IS NULL)),
    CHECK ((status IN ('SUCCEEDED', 'FAILED')) = (finished_at IS NOT NULL))
);
-- the claim index: PENDING jobs in claim order
CREATE INDEX embedding_jobs_claim ON embedding_jobs (priority DESC, available_at, id)
    WHERE status = 'PENDING';
-- lease recovery scans only PROCESSING jobs
CREATE INDEX embedding_jobs_lease ON embedding_jobs (lease_expires_at) WHERE status = 'PROCESSING';

CREATE TABLE embedding_job_attempts (
    id                 uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    embedding_job_id   uuid NOT NULL REFERENCES embedding_jobs (id) ON DELETE CASCADE,
    attempt_no         integer NOT NULL CHECK (attempt_no >= 1),
    worker_id          uuid NOT NULL REFERENCES indexing_workers (id),
    status             text NOT NULL DEFAULT 'STARTED'
                       CHECK (status IN ('STARTED', 'SUCCEEDED', 'FAILED', 'EXPIRED')),
    failure_type       text CHECK (failure_type IN (
                           'STORAGE_UNAVAILABLE', 'DOCUMENT_CONTENT_INVALID',
                           'EMBEDDING_PROVIDER_UNAVAILABLE', 'EMBEDDING_RESULT_INVALID',
                           'INDEXING_STATE_INCONSISTENT', 'WORKER_INTERNAL_ERROR')),
    failure_message    text CHECK (length(failure_message) <= 500),
    started_at         timestamptz NOT NULL DEFAULT now(),
    finished_at        timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    UNIQUE (embedding_job_id, attempt_no),
    CHECK ((status = 'STARTED') = (finished_at IS NULL)),
    CHECK ((status = 'FAILED') = (failure_type IS NOT NULL))
);
-- at most one running attempt per job
CREATE UNIQUE INDEX embedding_job_attempts_one_started
    ON embedding_job_attempts (embedding_job_id) WHERE status = 'STARTED';

CREATE TABLE indexing_events (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_type           text NOT NULL,
    embedding_job_id     uuid,
    document_version_id  uuid,
    attempt_id           uuid,
    worker_id            uuid,
    detail               jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX indexing_events_job ON indexing_events (embedding_job_id, id);

