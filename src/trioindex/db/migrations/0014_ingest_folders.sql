-- The folders `ingest` was given, each with the key root its files are keyed under, and which
-- documents each folder's ingests hold. A folder is known by its resolved path (bytes: a name
-- need not be UTF-8), so a link to it, or its relative and absolute names, are one folder;
-- later ingests key its files under the recorded root whatever the current folder is, and
-- `--sync` deletes only documents the folder holds (two folders keyed into one namespace
-- never delete each other's documents).

CREATE TABLE ingest_folders (
    id                uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    real_path         bytea NOT NULL UNIQUE CHECK (octet_length(real_path) BETWEEN 1 AND 4096),
    key_root          text NOT NULL CHECK (length(key_root) <= 1024),
    created_at        timestamptz NOT NULL DEFAULT now(),
    last_ingested_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE ingest_folder_documents (
    folder_id    uuid NOT NULL REFERENCES ingest_folders (id) ON DELETE CASCADE,
    document_id  uuid NOT NULL REFERENCES documents (id) ON DELETE CASCADE,
    PRIMARY KEY (folder_id, document_id)
);

-- a document's deletion cascades here by document_id
CREATE INDEX ingest_folder_documents_document ON ingest_folder_documents (document_id);
