-- The object's ETag when a version was registered from objects already in the bucket
-- (`ingest s3://bucket/prefix`): the next run skips an object whose key, size and ETag match
-- its document's newest version without downloading it. NULL for uploads by trioindex itself.
ALTER TABLE document_versions ADD COLUMN source_etag text;
