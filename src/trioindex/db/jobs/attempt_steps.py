"""The running attempt's step columns on the job row, as one ``SET`` list that empties them."""

from __future__ import annotations

# Every write that starts or ends an attempt empties them in its own update of the job row (no
# extra write): the failure report and lease recovery, so a job that runs no attempt carries
# none (the claim, so a new attempt starts with no steps, and the completion and the hand-back
# do the same in functions.sql). Readers see them only on a PROCESSING job
# (trioindex_job_attempts).
ATTEMPT_STEPS_CLEARED = """attempt_parse_started_at = NULL, attempt_chunks_stored_at = NULL,
        attempt_chunks = NULL, attempt_characters = NULL, attempt_replaced_sequences = NULL,
        attempt_embedding_started_at = NULL, attempt_embeddings_stored_at = NULL,
        attempt_embeddings = NULL, attempt_embedding_slices = NULL"""
