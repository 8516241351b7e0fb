-- Attempt status CANCELLED: a claim handed back at shutdown. It keeps its number (attempt
-- numbers stay consecutive) but does not spend the budget (the hand-back is in functions.sql).

ALTER TABLE embedding_job_attempts DROP CONSTRAINT embedding_job_attempts_status_check;
ALTER TABLE embedding_job_attempts ADD CONSTRAINT embedding_job_attempts_status_check
    CHECK (status IN ('STARTED', 'SUCCEEDED', 'FAILED', 'EXPIRED', 'CANCELLED'));
