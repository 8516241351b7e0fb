"""The error hierarchy of trioindex, and the six failure types a job can end with.

::

    TrioindexError
    ├── ConfigError                  bad configuration value (names key and value)
    ├── DatabaseUnavailable          PostgreSQL cannot be reached
    ├── OwnershipLost                a fenced write from a worker that no longer owns the claim
    │   └── JobRemoved               the job is gone: document deleted or model removed
    ├── StepFailure                  a pipeline step failed; carries a FailureType + safe message
    │   ├── StorageUnavailable       STORAGE_UNAVAILABLE (retryable)
    │   │   └── ObjectNotFound       the object is missing from the store
    │   ├── ContentInvalid           DOCUMENT_CONTENT_INVALID
    │   ├── ProviderUnavailable      EMBEDDING_PROVIDER_UNAVAILABLE (retryable)
    │   ├── ResultInvalid            EMBEDDING_RESULT_INVALID
    │   │   └── ProviderRejectedInput  the embedder refused the input (413/422)
    │   └── StateInconsistent        INDEXING_STATE_INCONSISTENT
    └── NotFound                     an operator asked for a row that does not exist

Messages are written for people and never carry a claim token, chunk text, a vector, a
credential or a full external response: every constructor takes an already-safe message and
:func:`bounded` cuts it to :data:`MAX_MESSAGE_LENGTH`.
"""

from __future__ import annotations

import enum

MAX_MESSAGE_LENGTH = 500


class FailureType(enum.StrEnum):
    """The six classified causes a job attempt can fail with (docs/design/architecture.md)."""

    STORAGE_UNAVAILABLE = "STORAGE_UNAVAILABLE"
    DOCUMENT_CONTENT_INVALID = "DOCUMENT_CONTENT_INVALID"
    EMBEDDING_PROVIDER_UNAVAILABLE = "EMBEDDING_PROVIDER_UNAVAILABLE"
    EMBEDDING_RESULT_INVALID = "EMBEDDING_RESULT_INVALID"
    INDEXING_STATE_INCONSISTENT = "INDEXING_STATE_INCONSISTENT"
    WORKER_INTERNAL_ERROR = "WORKER_INTERNAL_ERROR"

    @property
    def retryable(self) -> bool:
        return self in _RETRYABLE


_RETRYABLE = frozenset(
    {
        FailureType.STORAGE_UNAVAILABLE,
        FailureType.EMBEDDING_PROVIDER_UNAVAILABLE,
        FailureType.WORKER_INTERNAL_ERROR,
    }
)


def bounded(message: str, limit: int = MAX_MESSAGE_LENGTH) -> str:
    """One line, at most ``limit`` characters: safe to store in a job row or an event."""
    one_line = " ".join(message.split())
    if len(one_line) <= limit:
        return one_line
    return one_line[: limit - 1] + "…"


class TrioindexError(Exception):
    """Base of every error trioindex raises on purpose."""


class ConfigError(TrioindexError):
    """A configuration value is invalid; the message names the key and the value."""


class DatabaseUnavailable(TrioindexError):
    """PostgreSQL could not be reached or refused the connection."""


class NotFound(TrioindexError):
    """An operator asked for a job, document or model that does not exist."""


class OwnershipLost(TrioindexError):
    """The claim behind a fenced write is no longer held by this worker.

    Raised when the job is not PROCESSING, belongs to another worker, carries another claim
    token, its lease has expired, or the attempt is not the one the job runs. The write
    changed nothing; lease recovery owns the job from here.
    """


class ModelRemoved(TrioindexError):
    """The model a worker embeds with was removed (``models remove``): its jobs are gone, and
    a model registered again under the same name is a new row the worker was not started
    for. The worker stops; started again, it follows the model by name."""


class JobRemoved(OwnershipLost):
    """The job row is gone: its document was deleted, or its model removed, while it ran.

    Not a fault and not a lost lease: the worker stops writing and ends the job quietly;
    nothing it wrote before survives (the rows went with the document).
    """


class StepFailure(TrioindexError):
    """A pipeline step failed for a classified reason.

    ``failure_type`` alone decides the retry policy (docs/design/architecture.md).
    """

    failure_type: FailureType = FailureType.WORKER_INTERNAL_ERROR

    def __init__(self, message: str) -> None:
        self.message = bounded(message)
        super().__init__(self.message)

    @property
    def retryable(self) -> bool:
        return self.failure_type.retryable


class StorageUnavailable(StepFailure):
    failure_type = FailureType.STORAGE_UNAVAILABLE


class ObjectNotFound(StorageUnavailable):
    """The object is not in the store (deleted, or a wrong key)."""


class ContentInvalid(StepFailure):
    failure_type = FailureType.DOCUMENT_CONTENT_INVALID


class ProviderUnavailable(StepFailure):
    failure_type = FailureType.EMBEDDING_PROVIDER_UNAVAILABLE


class ResultInvalid(StepFailure):
    failure_type = FailureType.EMBEDDING_RESULT_INVALID


class ProviderRejectedInput(ResultInvalid):
    """The embedding server refused the input itself (HTTP 413/422): retrying cannot help."""


class StateInconsistent(StepFailure):
    failure_type = FailureType.INDEXING_STATE_INCONSISTENT
