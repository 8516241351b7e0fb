"""Immutable values that cross module boundaries: claims, rows as read by operators, outcomes.

Rows become values through ``from_row`` classmethods. The claim token is a secret capability:
it is a ``repr=False`` field and is never logged, stored in an event or put in a message.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any
from uuid import UUID

import attrs

from trioindex.errors import FailureType


class JobStatus(enum.StrEnum):
    PENDING = "PENDING"
    PROCESSING = "PROCESSING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


#: The chunk set of character chunking, which every model without a tokenizer shares; a
#: token-aware chunker's set is :func:`token_chunking` of its model.
CHARACTER_CHUNKING = "characters"


def token_chunking(model_name: str) -> str:
    """The chunk set a token-aware chunker makes with ``model_name``'s tokenizer."""
    return f"tokens:{model_name}"


class WorkerStatus(enum.StrEnum):
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"


@attrs.frozen
class ParseSnapshot:
    """What the parse step reads, as the claim saw the job's version: where its bytes are, their
    size and sha256. ``parse_started_at`` is the claim's time, when the parse may begin: the
    chunk commit records it on the attempt, and refuses the commit if the version no longer
    matches this snapshot."""

    version_id: UUID
    document_id: UUID
    storage_key: str
    original_name: str
    content_type: str | None
    byte_size: int
    sha256: str
    parse_started_at: datetime | None = None


@attrs.frozen
class Claim:
    """The execution context of one claimed job, fixed at claim time.

    Every write after the claim is fenced by ``(job_id, worker_id, claim_token, attempt_id)``.
    """

    job_id: UUID
    worker_id: UUID
    claim_token: UUID = attrs.field(repr=False)
    document_version_id: UUID
    embedding_model_id: UUID
    attempt_id: UUID
    attempt_no: int
    lease_expires_at: datetime
    # the document's key, for log lines (never in metric labels); the claim statement reads it
    document_key: str = ""
    # the chunk set the claiming worker makes and embeds, and whether the version already has
    # it: without it the job parses the file first, with it the job only embeds
    chunking: str = CHARACTER_CHUNKING
    chunks_ready: bool = True
    # what the parse reads, when the job parses (its chunk set is not stored yet): the claim
    # statement reads it with the claim, so the parse needs no transaction of its own first
    parse: ParseSnapshot | None = attrs.field(default=None, repr=False)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Claim:
        parse = None
        if not row["chunks_ready"]:
            parse = ParseSnapshot(
                version_id=row["document_version_id"],
                document_id=row["document_id"],
                storage_key=row["storage_key"],
                original_name=row["original_name"],
                content_type=row["content_type"],
                byte_size=row["byte_size"],
                sha256=row["sha256"],
                parse_started_at=row["parse_started_at"],
            )
        return cls(
            job_id=row["job_id"],
            worker_id=row["worker_id"],
            claim_token=row["claim_token"],
            document_version_id=row["document_version_id"],
            embedding_model_id=row["embedding_model_id"],
            attempt_id=row["attempt_id"],
            attempt_no=row["attempt_no"],
            lease_expires_at=row["lease_expires_at"],
            document_key=row["document_key"],
            chunking=row["chunking"],
            chunks_ready=row["chunks_ready"],
            parse=parse,
        )


@attrs.frozen
class BackoffPolicy:
    """The retry delay's settings: ``initial * 2**(attempt-1)``, capped at ``maximum``, ±
    ``jitter``. The delay itself has one definition, the SQL function ``trioindex_retry_delay``,
    which both a failure report and lease recovery call."""

    initial: float
    maximum: float
    jitter: float


class FailOutcome(enum.StrEnum):
    RETRY_SCHEDULED = "RETRY_SCHEDULED"
    FAILED = "FAILED"


@attrs.frozen
class FailResult:
    outcome: FailOutcome
    available_at: datetime | None


@attrs.frozen
class CompleteResult:
    """``became_current`` is False when a newer version was already searchable."""

    became_current: bool


@attrs.frozen
class DrainState:
    """What a draining worker still waits for (jobs of its model only).

    ``scheduled``: PENDING jobs, whether claimable now or at a later ``available_at``;
    ``orphaned``: PROCESSING jobs whose holder is not a live worker (not RUNNING, or its
    heartbeat is older than the timeout), which lease recovery will return to the queue.
    ``next_due_in`` is the number of seconds until the earliest of those becomes actionable
    (a retry's ``available_at`` or an orphan's lease expiry); 0 when one already is.
    """

    scheduled: int
    orphaned: int
    expired_orphans: int
    next_due_in: float | None

    @property
    def drained(self) -> bool:
        return self.scheduled == 0 and self.orphaned == 0


@attrs.frozen
class RecoveredJob:
    job_id: UUID
    attempt_no: int
    outcome: FailOutcome


@attrs.frozen
class AttemptView:
    id: UUID
    attempt_no: int
    worker_id: UUID
    status: str
    failure_type: FailureType | None
    failure_message: str | None
    started_at: datetime
    finished_at: datetime | None
    # the steps this attempt ran, each when it happened (None: not reached), with their counts
    parse_started_at: datetime | None = None
    chunks_stored_at: datetime | None = None
    chunks: int | None = None  # the chunk set this attempt stored
    characters: int | None = None
    replaced_sequences: int | None = None  # invalid byte sequences decoding replaced
    embedding_started_at: datetime | None = None
    embeddings_stored_at: datetime | None = None  # its last slice of vectors
    embeddings: int | None = None  # the vectors this attempt stored
    embedding_slices: int | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> AttemptView:
        return cls(
            id=row["id"],
            attempt_no=row["attempt_no"],
            worker_id=row["worker_id"],
            status=row["status"],
            failure_type=FailureType(row["failure_type"]) if row["failure_type"] else None,
            failure_message=row["failure_message"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            parse_started_at=row["parse_started_at"],
            chunks_stored_at=row["chunks_stored_at"],
            chunks=row["chunks"],
            characters=row["characters"],
            replaced_sequences=row["replaced_sequences"],
            embedding_started_at=row["embedding_started_at"],
            embeddings_stored_at=row["embeddings_stored_at"],
            embeddings=row["embeddings"],
            embedding_slices=row["embedding_slices"],
        )

    def step_lines(self) -> list[str]:
        """The steps this attempt reached, one line each: seconds after the attempt started,
        and what the step stored."""

        def after(at: datetime) -> str:
            return f"+{(at - self.started_at).total_seconds():.2f}s"

        lines = []
        if self.parse_started_at:
            lines.append(f"parse started {after(self.parse_started_at)}")
        if self.chunks_stored_at:
            replaced = (
                f", {self.replaced_sequences} byte sequences replaced"
                if self.replaced_sequences
                else ""
            )
            lines.append(
                f"chunks stored {after(self.chunks_stored_at)}: {self.chunks} chunks,"
                f" {self.characters} characters{replaced}"
            )
        if self.embedding_started_at:
            lines.append(f"embedding started {after(self.embedding_started_at)}")
        if self.embeddings_stored_at:
            lines.append(
                f"embeddings stored {after(self.embeddings_stored_at)}: {self.embeddings}"
                f" vectors in {self.embedding_slices} slice(s)"
            )
        return lines


@attrs.frozen
class JobView:
    """A job as operators see it: no claim token."""

    id: UUID
    document_key: str
    version_no: int
    # whether this version is the one the job's model serves for the document
    version_served: bool
    model: str
    status: JobStatus
    priority: int
    attempt_count: int
    max_attempts: int
    available_at: datetime
    worker_id: UUID | None
    lease_expires_at: datetime | None
    progress: int
    chunk_count: int | None  # the chunks (and vectors) its model indexed, once SUCCEEDED
    last_failure_type: FailureType | None
    last_failure_message: str | None
    created_at: datetime
    finished_at: datetime | None
    attempts: tuple[AttemptView, ...] = ()
    # the attempts since the job was created or last retried (a handed-back one spends
    # nothing), and the budget they count against: what `worker.max-attempts` gave it
    attempts_spent: int = 0
    attempt_budget: int = 0

    @classmethod
    def from_row(cls, row: dict[str, Any], attempts: tuple[AttemptView, ...] = ()) -> JobView:
        return cls(
            id=row["id"],
            document_key=row["external_key"],
            version_no=row["version_no"],
            version_served=row["version_served"],
            model=row["model_name"],
            status=JobStatus(row["status"]),
            priority=row["priority"],
            attempt_count=row["attempt_count"],
            max_attempts=row["max_attempts"],
            available_at=row["available_at"],
            worker_id=row["worker_id"],
            lease_expires_at=row["lease_expires_at"],
            progress=row["progress"],
            chunk_count=row["chunk_count"],
            last_failure_type=(
                FailureType(row["last_failure_type"]) if row["last_failure_type"] else None
            ),
            last_failure_message=row["last_failure_message"],
            created_at=row["created_at"],
            finished_at=row["finished_at"],
            attempts=attempts,
            attempts_spent=row["attempts_spent"],
            attempt_budget=row["attempts_spent"] + row["max_attempts"] - row["attempt_count"],
        )


def as_json(value: object) -> object:
    """attrs values → JSON-ready dicts (UUIDs and datetimes as strings)."""
    if attrs.has(type(value)):
        fields = attrs.asdict(value, recurse=False)  # type: ignore[arg-type]
        return {k: as_json(v) for k, v in fields.items()}
    if isinstance(value, (list, tuple)):
        return [as_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): as_json(v) for k, v in value.items()}
    if isinstance(value, (UUID, datetime)):
        return str(value) if isinstance(value, UUID) else value.isoformat()
    return value
