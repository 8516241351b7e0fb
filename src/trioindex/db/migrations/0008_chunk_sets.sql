-- Chunk sets: a version keeps one set of chunks per chunking, so a model whose
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
-- if another model already indexed the version, and stores its own set beside the other.
--
-- Search ranks a model's chunks only: the vector ranking through its embeddings, the text
-- ranking by chunks that have one of its vectors (trioindex.search.ranking).

ALTER TABLE document_chunks ADD COLUMN chunking text NOT NULL DEFAULT 'characters';
ALTER TABLE document_chunks DROP CONSTRAINT document_chunks_document_version_id_chunk_index_key;
ALTER TABLE document_chunks
    ADD CONSTRAINT document_chunks_set_index UNIQUE (document_version_id, chunking, chunk_index);

ALTER TABLE indexing_workers ADD COLUMN chunking text NOT NULL DEFAULT 'characters';
ALTER TABLE embedding_jobs ADD COLUMN chunking text NOT NULL DEFAULT 'characters';
