-- A chunk's full-text column holds its `english` lexemes only: Snowball stems with English stop
-- words dropped, and every word the English stemmer does not know (Hangul, Cyrillic, CJK,
-- numbers, addresses) as written, lower-cased.
--
-- The `simple` half it held beside them was never matched: a text query asks for the English
-- lexemes of its words and for its Hangul words as prefixes, and for Hangul (and every other
-- word the stemmer leaves alone) `simple` and `english` give the same lexeme. So the half only
-- doubled those words' positions (a Korean word's tf counted twice over) and cost PostgreSQL a
-- second parse of every chunk's text on insert: 0.08-0.09 ms of CPU for 600 characters, a
-- fifth of what a small document's own rows cost (docs/test-results/sql_floor.md).
--
-- Dropping the column takes its GIN index with it; adding the new one rewrites
-- `document_chunks` under an ACCESS EXCLUSIVE lock and computes it for every chunk (4.6 s in
-- all for 100k chunks of 200 characters on 2 idle cores), so workers and searches wait
-- meanwhile. The index is then built over all rows, and ANALYZE gives the text
-- ranking's document frequencies their lexeme statistics back at once.

ALTER TABLE document_chunks DROP COLUMN search_vector;

ALTER TABLE document_chunks
    ADD COLUMN search_vector tsvector
    GENERATED ALWAYS AS (to_tsvector('english', content)) STORED;

CREATE INDEX document_chunks_search_vector ON document_chunks USING gin (search_vector);

ANALYZE document_chunks (search_vector);
