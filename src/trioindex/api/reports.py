"""What an ingest through :class:`trioindex.Index` did: :class:`IngestReport` (an entry per
file, and when it waited, the documents that failed and those deleted meanwhile) and
:class:`FailedDocument`."""

from __future__ import annotations

from uuid import UUID

import attrs

from trioindex.ingest import IngestEntry, IngestResult

__all__ = ["FailedDocument", "IngestReport"]


@attrs.frozen
class FailedDocument:
    """A document whose job, waited for, ended ``FAILED``: the failure type and the job's
    bounded last failure message (never chunk text)."""

    document_key: str
    failure_type: str
    message: str | None


@attrs.frozen
class IngestReport:
    """What :meth:`Index.ingest` did: one entry per file (``created``, ``unchanged``,
    ``repaired``, ``skipped``, ``error``) and, when it waited, the documents whose job ended
    ``FAILED`` (``failures``) and the keys whose documents were deleted while it waited
    (``removed``: their jobs can never finish)."""

    entries: tuple[IngestEntry, ...]
    failures: tuple[FailedDocument, ...] = ()
    removed: tuple[str, ...] = ()

    @property
    def queued(self) -> tuple[UUID, ...]:
        """The jobs this ingest queued: new versions', and failed jobs it sent back."""
        return tuple(
            e.job_id
            for e in self.entries
            if isinstance(e, IngestResult) and e.job_id and (e.status == "created" or e.requeued)
        )

    @property
    def failed(self) -> tuple[tuple[str, str], ...]:
        """``(document_key, failure_type)`` of each failure."""
        return tuple((f.document_key, f.failure_type) for f in self.failures)

    @property
    def errors(self) -> tuple[IngestEntry, ...]:
        return tuple(e for e in self.entries if e.status == "error")
