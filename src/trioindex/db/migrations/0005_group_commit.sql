-- Room on each page for a row's next version, so that an update touching no indexed column
-- (progress, a claim's columns) is a HOT update: no new
-- entry in every index of the table. A job row is updated four to six times in its life.
ALTER TABLE embedding_jobs SET (fillfactor = 50);
ALTER TABLE document_versions SET (fillfactor = 70);
ALTER TABLE documents SET (fillfactor = 70);
