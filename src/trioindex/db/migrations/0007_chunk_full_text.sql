-- Full-text search over chunk text, for `search --mode text|hybrid`.
--
-- search_vector holds every chunk's lexemes twice over: the `simple` configuration (each word
-- lower-cased, no stemming, no stop words: works for Korean and any other language the default
-- parser splits into words) and `english` (Snowball stems, English stop words dropped). A query
-- matches either (see trioindex.search.ranking). Both configurations ship with PostgreSQL.
--
-- A STORED generated column: PostgreSQL computes it on every insert (the parse step's COPY
-- does not name it) and this ALTER rewrites the table once, computing it for every existing
-- chunk under an ACCESS EXCLUSIVE lock; the GIN index is then built over all rows. Measured:
-- 8-14 s for 100k short chunks on 2 busy cores (docs/test-results/search.md), so minutes for
-- millions; workers and searches wait meanwhile.

ALTER TABLE document_chunks
    ADD COLUMN search_vector tsvector
    GENERATED ALWAYS AS (to_tsvector('simple', content) || to_tsvector('english', content)) STORED;

CREATE INDEX document_chunks_search_vector ON document_chunks USING gin (search_vector);
