-- Each attempt records its own steps: when the parse began, when the chunk set was stored (with
-- its chunk count, characters and replaced byte sequences), when embedding began, and when its
-- last slice of vectors was stored (with the vectors and slices this attempt stored). The steps were event
-- rows; events are kept for the transitions an operator must see.

ALTER TABLE embedding_job_attempts
    ADD COLUMN parse_started_at      timestamptz,
    ADD COLUMN chunks_stored_at      timestamptz,
    ADD COLUMN chunks                integer CHECK (chunks >= 1),
    ADD COLUMN characters            integer CHECK (characters >= 0),
    ADD COLUMN replaced_sequences    integer CHECK (replaced_sequences >= 1),
    ADD COLUMN embedding_started_at  timestamptz,
    ADD COLUMN embeddings_stored_at  timestamptz,
    ADD COLUMN embeddings            integer CHECK (embeddings >= 1),
    ADD COLUMN embedding_slices      integer CHECK (embedding_slices >= 1);

-- An attempt is updated at each step without touching an indexed column: room on its page for
-- the next version keeps those updates HOT.
ALTER TABLE embedding_job_attempts SET (fillfactor = 70);

-- The step events of attempts before this migration, folded into their attempt rows; the events
-- themselves go (nothing writes or reads them any more).
UPDATE embedding_job_attempts a
SET parse_started_at = s.parse_started_at, chunks_stored_at = s.chunks_stored_at,
    chunks = s.chunks, characters = s.characters, replaced_sequences = s.replaced,
    embedding_started_at = s.embedding_started_at,
    embeddings_stored_at = s.embeddings_stored_at, embeddings = s.embeddings,
    embedding_slices = nullif(s.slices, 0)
FROM (SELECT e.attempt_id,
             min(e.created_at) FILTER (WHERE e.event_type = 'PARSING_STARTED')
                 AS parse_started_at,
             min(e.created_at) FILTER (WHERE e.event_type = 'CHUNKS_STORED') AS chunks_stored_at,
             max((e.detail ->> 'chunks')::integer) FILTER (WHERE e.event_type = 'CHUNKS_STORED')
                 AS chunks,
             max((e.detail ->> 'characters')::integer)
                 FILTER (WHERE e.event_type = 'CHUNKS_STORED') AS characters,
             max((e.detail ->> 'replaced_sequences')::integer)
                 FILTER (WHERE e.event_type = 'CHUNKS_STORED') AS replaced,
             min(e.created_at) FILTER (WHERE e.event_type = 'EMBEDDING_STARTED')
                 AS embedding_started_at,
             max(e.created_at) FILTER (WHERE e.event_type = 'EMBEDDINGS_STORED')
                 AS embeddings_stored_at,
             sum((e.detail ->> 'embeddings')::integer)
                 FILTER (WHERE e.event_type = 'EMBEDDINGS_STORED')::integer AS embeddings,
             count(*) FILTER (WHERE e.event_type = 'EMBEDDINGS_STORED')::integer AS slices
      FROM indexing_events e
      WHERE e.attempt_id IS NOT NULL
        AND e.event_type IN ('PARSING_STARTED', 'CHUNKS_STORED', 'EMBEDDING_STARTED',
                             'EMBEDDINGS_STORED')
      GROUP BY e.attempt_id) AS s
WHERE a.id = s.attempt_id;

DELETE FROM indexing_events
WHERE event_type IN ('PARSING_STARTED', 'CHUNKS_STORED', 'EMBEDDING_STARTED', 'EMBEDDINGS_STORED');

-- served_versions: the unique (model, version) key becomes (version, model). Its old order led
-- with the model like the primary key (model, document), so a lookup of one document's served
-- row could be planned on it, reading every served row of the model (a completion's cost then
-- grew with the model's documents); and (version, model) also serves the lookups by version
-- alone, so the separate index on the version goes: one index entry fewer per served row.
ALTER TABLE served_versions
    DROP CONSTRAINT served_versions_embedding_model_id_document_version_id_key,
    ADD CONSTRAINT served_versions_version_model_key
        UNIQUE (document_version_id, embedding_model_id);
DROP INDEX served_versions_version;
