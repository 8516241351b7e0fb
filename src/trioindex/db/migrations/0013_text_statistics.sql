-- BM25's collection statistics: per model and document, the chunk count and text length (in
-- characters) of the chunk set the model serves for that document. Text search sums them for N
-- (chunks) and the average chunk length; trioindex_track_text_statistics (functions.sql) keeps
-- each row current as served_versions moves, so a search reads one row per served document
-- instead of every chunk.

CREATE TABLE served_text_statistics (
    embedding_model_id  uuid NOT NULL REFERENCES embedding_models (id) ON DELETE CASCADE,
    document_id         uuid NOT NULL REFERENCES documents (id) ON DELETE CASCADE,
    chunks              integer NOT NULL CHECK (chunks >= 0),
    text_length         bigint NOT NULL CHECK (text_length >= 0),
    PRIMARY KEY (embedding_model_id, document_id)
);

INSERT INTO served_text_statistics (embedding_model_id, document_id, chunks, text_length)
SELECT s.embedding_model_id, s.document_id, count(c.id), coalesce(sum(length(c.content)), 0)
FROM served_versions s
LEFT JOIN embeddings e ON e.document_version_id = s.document_version_id
                      AND e.embedding_model_id = s.embedding_model_id
LEFT JOIN document_chunks c ON c.id = e.chunk_id
GROUP BY s.embedding_model_id, s.document_id;
