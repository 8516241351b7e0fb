"""One claimed job, from its first step to its outcome: the per-job part of the worker runtime.

The runtime (:mod:`trioindex.worker.runtime`) owns the slots and the nurseries; for each claim
it starts :meth:`JobRunner.run` in the jobs nursery. That runs the pipeline steps inside the
job's own cancel scope while the worker-wide :class:`~trioindex.worker.leases.LeaseRenewer`
renews the job's lease (and cancels that scope if the lease is refused), writes the final
completion or a classified failure, hands the claim back when the job was cancelled, and says
how the attempt ended as a :class:`JobOutcome` value.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Protocol

import attrs
import trio

from trioindex.config import WorkerSettings
from trioindex.errors import (
    FailureType,
    JobRemoved,
    OwnershipLost,
    StepFailure,
    bounded,
)
from trioindex.values import Claim, CompleteResult, FailOutcome, FailResult
from trioindex.worker import metrics
from trioindex.worker.counters import WorkerCounters
from trioindex.worker.leases import LeaseRenewer, LeaseWrites

logger = logging.getLogger(__name__)

# How long a bounded cleanup write (STOPPING/STOPPED, a hand-back, a final report) may take.
CLEANUP_TIMEOUT = 10.0
# How much of a document key an outcome line shows (keys may be up to 1024 characters).
LOGGED_KEY_LENGTH = 200


class JobWrites(LeaseWrites, Protocol):
    """The writes claimed jobs make (:class:`trioindex.worker.queue.JobQueue`)."""

    async def complete(self, claim: Claim) -> CompleteResult: ...
    async def fail(self, claim: Claim, failure_type: FailureType, message: str) -> FailResult: ...
    async def release(self, claim: Claim) -> None: ...


class Steps(Protocol):
    """The pipeline steps (:class:`trioindex.worker.wiring.PipelineSteps`).

    ``complete`` is the job's final write (with the grouped steps it also stores the vectors:
    see :mod:`trioindex.pipeline.embed_step`); ``forget`` drops what the steps kept for a claim
    once its job has ended, however it ended; ``serve`` runs the steps' worker-wide tasks (the
    embedding coalescer, the group committers) in the runtime's background nursery until it is
    cancelled, after the last job.
    """

    async def parse(self, claim: Claim) -> int: ...
    async def embed(self, claim: Claim) -> int: ...
    async def complete(self, claim: Claim) -> CompleteResult: ...
    def forget(self, claim: Claim) -> None: ...
    async def serve(self) -> None: ...


class OutcomeKind(enum.StrEnum):
    """How an attempt ended on this worker; the value is the ``outcome`` metrics label."""

    SUCCEEDED = "succeeded"
    RETRY = "retry"  # failed, retry scheduled
    FAILED = "failed"  # failed for good
    LOST = "lost"  # ownership lost: no further writes, lease recovery owns the job
    RELEASED = "released"  # cancelled and handed back: PENDING again at once
    REMOVED = "removed"  # the job's document was deleted (or its model removed): ended quietly
    CANCELLED = "cancelled"  # cancelled, hand-back refused or impossible: left to recovery
    REPORT_REFUSED = "report-refused"  # the failure report was refused (ownership lost)
    REPORT_FAILED = "report-failed"  # the failure report could not be written (or timed out)


_WITH_FAILURE_TYPE = frozenset({OutcomeKind.RETRY, OutcomeKind.FAILED})


@attrs.frozen
class JobOutcome:
    """How one attempt ended. ``failure_type`` is set exactly for RETRY and FAILED."""

    kind: OutcomeKind
    failure_type: FailureType | None = None

    def __attrs_post_init__(self) -> None:
        if (self.failure_type is not None) != (self.kind in _WITH_FAILURE_TYPE):
            raise ValueError(f"outcome {self.kind} with failure type {self.failure_type}")

    def __str__(self) -> str:
        """As logs show it: ``succeeded``, ``released``, ``retry:STORAGE_UNAVAILABLE``."""
        if self.failure_type is None:
            return self.kind.value
        return f"{self.kind.value}:{self.failure_type.value}"


SUCCEEDED = JobOutcome(OutcomeKind.SUCCEEDED)
LOST = JobOutcome(OutcomeKind.LOST)
RELEASED = JobOutcome(OutcomeKind.RELEASED)
CANCELLED = JobOutcome(OutcomeKind.CANCELLED)
REPORT_REFUSED = JobOutcome(OutcomeKind.REPORT_REFUSED)
REPORT_FAILED = JobOutcome(OutcomeKind.REPORT_FAILED)
REMOVED = JobOutcome(OutcomeKind.REMOVED)


def steps_for(*, chunks_ready: bool) -> tuple[str, ...]:
    """Which steps a claim runs: without its chunk set stored (``Claim.chunks_ready``) the job
    parses the file first; with it (another model's job shares the set, or an earlier attempt
    of this job stored it) it only embeds."""
    return ("embed", "complete") if chunks_ready else ("parse", "embed", "complete")


@attrs.define(eq=False)
class JobContext:
    """One claim in flight. ``lease_deadline`` is a local, conservative estimate (Trio clock)."""

    claim: Claim
    lease_deadline: float
    scope: trio.CancelScope
    # when the lease renewer next renews this job's lease (Trio clock; set by LeaseRenewer.hold)
    renew_at: float = math.inf
    lost: bool = False
    removed: bool = False  # lost because the job row is gone (document deleted, model removed)
    step: str = "claim"
    # Set just before the final write (complete or fail). A renewal racing that write waits on
    # the job row lock and then finds the job finished: that is not a lost lease.
    finishing: bool = False
    # Awaited once, just before the completion is written: the runtime moves the job from its
    # slot to a finishing place, so the next claim need not wait for this write to commit.
    before_completion: Callable[[], Awaitable[None]] | None = None
    # How the job ended so far; final once JobRunner.run returns or raises.
    outcome: JobOutcome = CANCELLED
    # The bounded failure message reported for the job (already safe: see trioindex.errors).
    message: str = ""


@attrs.define(eq=False)
class JobRunner:
    """Runs claimed jobs for one :meth:`~trioindex.worker.runtime.Worker.serve` call."""

    queue: JobWrites
    steps: Steps
    settings: WorkerSettings
    counters: WorkerCounters
    leases: LeaseRenewer

    async def run(self, context: JobContext) -> None:
        """Run the job inside ``context.scope`` and set ``context.outcome``.

        The outcome is set even when a ``BaseException`` (a fatal error, a cancellation from
        outside) ends the job: the caller reads it in its own ``finally``.
        """
        started = trio.current_time()
        self.leases.hold(context)
        try:
            with context.scope:
                context.outcome = await self._execute(context)
            if context.lost and context.outcome == CANCELLED:
                # cancelled by the lease renewer: the lease was refused, or the job is gone
                if context.removed:
                    _log_removed(context.claim, "renewal")
                    context.outcome = REMOVED
                else:
                    context.outcome = LOST
                    self.counters.lost += 1
        finally:
            self.leases.drop(context)  # the final write is done (or never will be)
            self.steps.forget(context.claim)
            if context.outcome == CANCELLED and not context.lost:
                context.outcome = await self._hand_back(context)
            self._record(context, trio.current_time() - started)

    def _record(self, context: JobContext, seconds: float) -> None:
        claim, outcome = context.claim, context.outcome
        if outcome.kind in (OutcomeKind.CANCELLED, OutcomeKind.RELEASED):
            self.counters.cancelled += 1
        failure_type = "" if outcome.failure_type is None else outcome.failure_type.value
        metrics.record_job(outcome.kind.value, failure_type)
        # the key is the operator's own name for the document, one line and bounded; the
        # message is the bounded one the job row stores, never text, vectors or a token
        logger.info(
            "worker %s job %s attempt %s key %r: %s after %.2fs (step %s)%s",
            claim.worker_id,
            claim.job_id,
            claim.attempt_id,
            bounded(claim.document_key, LOGGED_KEY_LENGTH),
            outcome,
            seconds,
            context.step,
            f": {context.message}" if context.message else "",
        )

    async def _execute(self, context: JobContext) -> JobOutcome:
        """Run the steps; classify and report a failure."""
        claim = context.claim
        try:
            for step in steps_for(chunks_ready=claim.chunks_ready):
                context.step = step
                began = trio.current_time()
                if step == "parse":
                    await self.steps.parse(claim)
                elif step == "embed":
                    await self._embed(claim)
                else:
                    if context.before_completion is not None:
                        await context.before_completion()
                    context.finishing = True
                    # shielded: the call is never abandoned anyway, and a completion that
                    # committed must be reported as such, not as a cancelled job
                    with trio.CancelScope(shield=True):
                        await self.steps.complete(claim)
                metrics.record_step(step, trio.current_time() - began)
        except JobRemoved:
            context.lost = True
            _log_removed(claim, context.step)
            return REMOVED
        except OwnershipLost as exc:
            context.lost = True
            self.counters.lost += 1
            logger.warning(
                "worker %s job %s: ownership lost during %s (%s); no further writes",
                claim.worker_id,
                claim.job_id,
                context.step,
                exc,
            )
            return LOST
        except StepFailure as failure:
            return await self._report(context, failure.failure_type, failure.message)
        except Exception as exc:
            # Unknown errors are classified by type name only: their text may carry data.
            return await self._report(
                context,
                FailureType.WORKER_INTERNAL_ERROR,
                f"unexpected {type(exc).__name__} during {context.step}",
            )
        self.counters.succeeded += 1
        return SUCCEEDED

    async def _embed(self, claim: Claim) -> None:
        began = trio.current_time()
        try:
            await self.steps.embed(claim)
        except Exception as exc:
            metrics.record_embedding_call(type(exc).__name__, trio.current_time() - began)
            raise
        metrics.record_embedding_call("ok", trio.current_time() - began)

    async def _hand_back(self, context: JobContext) -> JobOutcome:
        """Return a cancelled job's claim to the queue at once (shielded, bounded).

        RELEASED when the job is PENDING again; CANCELLED when the write was refused (the
        claim no longer owns the job) or could not be made — lease recovery owns it then.
        """
        claim = context.claim
        context.finishing = True  # a renewal racing the hand-back is not a lost lease
        with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):
            try:
                await self.queue.release(claim)
            except OwnershipLost:
                logger.info(
                    "worker %s job %s: hand-back refused (the claim no longer owns the job)",
                    claim.worker_id,
                    claim.job_id,
                )
                return CANCELLED
            except Exception as exc:
                logger.warning(
                    "worker %s job %s: could not hand the job back (%s); lease recovery will",
                    claim.worker_id,
                    claim.job_id,
                    type(exc).__name__,
                )
                return CANCELLED
            return RELEASED
        logger.warning(
            "worker %s job %s: handing the job back timed out after %.0fs; lease recovery will",
            claim.worker_id,
            claim.job_id,
            CLEANUP_TIMEOUT,
        )
        return CANCELLED

    async def _report(
        self, context: JobContext, failure_type: FailureType, message: str
    ) -> JobOutcome:
        """Write a classified failure. Shielded and bounded: a failure found just as the job is
        cancelled (shutdown, a lost lease) is still reported, within ``CLEANUP_TIMEOUT``."""
        claim = context.claim
        context.finishing = True
        context.message = bounded(message)
        with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):
            return await self._fail(claim, failure_type, message)
        self.counters.report_refused += 1
        logger.warning(
            "worker %s job %s: reporting %s timed out after %.0fs; lease recovery will retry it",
            claim.worker_id,
            claim.job_id,
            failure_type,
            CLEANUP_TIMEOUT,
        )
        return REPORT_FAILED

    async def _fail(self, claim: Claim, failure_type: FailureType, message: str) -> JobOutcome:
        try:
            result = await self.queue.fail(claim, failure_type, message)
        except JobRemoved:
            _log_removed(claim, "the failure report")
            return REMOVED
        except OwnershipLost:
            self.counters.report_refused += 1
            logger.warning(
                "worker %s job %s: %s report refused (ownership lost); lease recovery owns it",
                claim.worker_id,
                claim.job_id,
                failure_type,
            )
            return REPORT_REFUSED
        except Exception as exc:
            self.counters.report_refused += 1
            logger.warning(
                "worker %s job %s: could not report %s (%s); lease recovery will retry it",
                claim.worker_id,
                claim.job_id,
                failure_type,
                type(exc).__name__,
            )
            return REPORT_FAILED
        if result.outcome is FailOutcome.RETRY_SCHEDULED:
            self.counters.retried += 1
            return JobOutcome(OutcomeKind.RETRY, failure_type)
        self.counters.failed += 1
        return JobOutcome(OutcomeKind.FAILED, failure_type)


def _log_removed(claim: Claim, during: str) -> None:
    """A removed job is no fault: one INFO line, and nothing else is written."""
    logger.info(
        "worker %s job %s: the job was removed during %s (document deleted or model removed);"
        " stopping without writes",
        claim.worker_id,
        claim.job_id,
        during,
    )
