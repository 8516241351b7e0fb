-- An ended attempt's primary key is its job and number, (embedding_job_id, attempt_no), the
-- key every reader of attempts goes by (a job's attempts, in order); the index on its id goes.
-- Nothing looks an attempt up by id: the id names it in events and in a job's timeline, and is
-- drawn by the claim (gen_random_uuid(), onto the job row) before the row is written. So an
-- attempt's row costs one index entry instead of two.
ALTER TABLE embedding_job_attempts DROP CONSTRAINT embedding_job_attempts_pkey;
ALTER TABLE embedding_job_attempts
    DROP CONSTRAINT embedding_job_attempts_embedding_job_id_attempt_no_key;
ALTER TABLE embedding_job_attempts ADD PRIMARY KEY (embedding_job_id, attempt_no);
-- the id stays required (events and the timeline name it)
ALTER TABLE embedding_job_attempts ALTER COLUMN id SET NOT NULL;

-- The worker ids of jobs and attempts are not checked against indexing_workers by a foreign
-- key: the claim is their one writer (an attempt copies its job's), and it writes only the id
-- of the RUNNING worker row it reads in the same statement; worker rows are never deleted
-- (a worker ends STOPPED) and every reader joins them as optional. The two checks locked the
-- one worker row FOR KEY SHARE from each claim and each completion, which all the worker's
-- slots did at once: a multixact and a lock record on that row every few jobs.
ALTER TABLE embedding_jobs DROP CONSTRAINT embedding_jobs_worker_id_fkey;
ALTER TABLE embedding_job_attempts DROP CONSTRAINT embedding_job_attempts_worker_id_fkey;
