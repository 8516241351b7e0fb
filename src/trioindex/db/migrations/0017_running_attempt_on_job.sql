-- The running attempt lives on its job row, and its attempt row is inserted once, whole, when
-- the attempt ends (succeeded, failed, handed back, expired). The claim writes the job row
-- alone: its id for the attempt (attempt_id, the fence's third key; events name it), its
-- number (attempt_count), worker (worker_id) and start (locked_at) were there already; the
-- steps the attempt runs are recorded in the attempt_* columns until it ends. So a job's
-- attempt costs one row insert instead of an insert and a non-HOT update (status was in the
-- one-started index's predicate), and the claim one row version instead of two.

ALTER TABLE embedding_jobs
    ADD COLUMN attempt_id                    uuid,
    ADD COLUMN attempt_parse_started_at      timestamptz,
    ADD COLUMN attempt_chunks_stored_at      timestamptz,
    ADD COLUMN attempt_chunks                integer CHECK (attempt_chunks >= 1),
    ADD COLUMN attempt_characters            integer CHECK (attempt_characters >= 0),
    ADD COLUMN attempt_replaced_sequences    integer CHECK (attempt_replaced_sequences >= 1),
    ADD COLUMN attempt_embedding_started_at  timestamptz,
    ADD COLUMN attempt_embeddings_stored_at  timestamptz,
    ADD COLUMN attempt_embeddings            integer CHECK (attempt_embeddings >= 1),
    ADD COLUMN attempt_embedding_slices      integer CHECK (attempt_embedding_slices >= 1);

-- The running attempts, folded into their jobs' rows; their rows are deleted (the attempt's
-- row is written when it ends, under the same id).
UPDATE embedding_jobs j
SET attempt_id = a.id, attempt_parse_started_at = a.parse_started_at,
    attempt_chunks_stored_at = a.chunks_stored_at, attempt_chunks = a.chunks,
    attempt_characters = a.characters, attempt_replaced_sequences = a.replaced_sequences,
    attempt_embedding_started_at = a.embedding_started_at,
    attempt_embeddings_stored_at = a.embeddings_stored_at, attempt_embeddings = a.embeddings,
    attempt_embedding_slices = a.embedding_slices
FROM embedding_job_attempts a
WHERE a.embedding_job_id = j.id AND a.status = 'STARTED' AND j.status = 'PROCESSING'
  AND a.attempt_no = j.attempt_count;
DELETE FROM embedding_job_attempts a
USING embedding_jobs j
WHERE a.embedding_job_id = j.id AND a.status = 'STARTED' AND j.attempt_id = a.id;
-- A STARTED row that is not its job's running attempt ran on no claim: it ended when its
-- claim did, unrecorded; it is EXPIRED now, as lease recovery would have marked it.
UPDATE embedding_job_attempts SET status = 'EXPIRED', finished_at = now()
WHERE status = 'STARTED';
-- A claim without its attempt row (never written by a release of trioindex) gets an id: its
-- writes are refused by the fence as before, and lease recovery records it when it expires.
UPDATE embedding_jobs SET attempt_id = gen_random_uuid()
WHERE status = 'PROCESSING' AND attempt_id IS NULL;

ALTER TABLE embedding_jobs ADD CONSTRAINT embedding_jobs_running_attempt_check
    CHECK ((status = 'PROCESSING') = (attempt_id IS NOT NULL));

-- An attempt row is an ended attempt: nothing can hold STARTED, and nothing updates the row.
DROP INDEX embedding_job_attempts_one_started;
ALTER TABLE embedding_job_attempts DROP CONSTRAINT embedding_job_attempts_check;
ALTER TABLE embedding_job_attempts DROP CONSTRAINT embedding_job_attempts_status_check;
ALTER TABLE embedding_job_attempts ADD CONSTRAINT embedding_job_attempts_status_check
    CHECK (status IN ('SUCCEEDED', 'FAILED', 'EXPIRED', 'CANCELLED'));
ALTER TABLE embedding_job_attempts ALTER COLUMN status DROP DEFAULT,
    ALTER COLUMN started_at DROP DEFAULT, ALTER COLUMN finished_at SET NOT NULL;
ALTER TABLE embedding_job_attempts RESET (fillfactor);
