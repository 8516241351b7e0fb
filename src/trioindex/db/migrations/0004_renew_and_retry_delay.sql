-- One definition each for lease renewal and the retry delay (issue 12).
--
-- 1. trioindex_renew_lease extends a lease through trioindex_lock_owned_job, the one definition
--    of "this claim still owns the job" (migration 0002), instead of repeating its conditions in
--    an UPDATE. Same semantics as that UPDATE: a claim that no longer owns the job is refused
--    with TI001 and nothing changes; the worker, the claim token and locked_at are never
--    touched; the new lease is counted from clock_timestamp(), not the transaction's start.
--    Still one statement, so still one round trip.
--
-- 2. trioindex_retry_delay is the retry backoff, in seconds: initial * 2^(attempt_no - 1),
--    capped at maximum, then spread by ± jitter. unit_random is a draw, uniform in [0, 1): lease
--    recovery passes random(), a failure report passes its own draw (so a test can fix it).
--    Both callers compute the same numbers the Python BackoffPolicy.delay computed before.

CREATE FUNCTION trioindex_retry_delay(
    p_attempt_no integer, p_initial float8, p_maximum float8, p_jitter float8,
    p_unit_random float8)
RETURNS float8 LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(0,
        least(p_maximum, p_initial * power(2::float8, greatest(p_attempt_no - 1, 0)))
        * (1 + p_jitter * (2 * p_unit_random - 1)))
$$;

CREATE FUNCTION trioindex_renew_lease(
    p_job uuid, p_worker uuid, p_token uuid, p_attempt uuid, p_lease_seconds float8)
RETURNS timestamptz LANGUAGE plpgsql AS $$
DECLARE
    j embedding_jobs;
    expires timestamptz;
BEGIN
    j := trioindex_lock_owned_job(p_job, p_worker, p_token, p_attempt);
    UPDATE embedding_jobs
    SET lease_expires_at = clock_timestamp() + make_interval(secs => p_lease_seconds)
    WHERE id = j.id
    RETURNING lease_expires_at INTO expires;
    RETURN expires;
END;
$$;
