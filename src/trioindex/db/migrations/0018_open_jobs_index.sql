-- One partial index for the jobs that are not SUCCEEDED instead of two: lease recovery's
-- (lease_expires_at of the PROCESSING jobs) and the model switch's (the model's PENDING,
-- PROCESSING and FAILED jobs). A claim moved its job into both, so each claim wrote two index
-- entries besides the key's and the (version, model) key's; it now writes one. Recovery reads
-- the PROCESSING jobs' entries (the only ones with a lease: lease_expires_at IS NOT NULL) one
-- model after the other; the switch and the drain count read the model's prefix.
DROP INDEX embedding_jobs_lease;
DROP INDEX embedding_jobs_unfinished_by_model;
CREATE INDEX embedding_jobs_open_by_model ON embedding_jobs (embedding_model_id, lease_expires_at)
    WHERE status IN ('PENDING', 'PROCESSING', 'FAILED');
