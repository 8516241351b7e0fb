"""The worker runtime: the only module that opens long-lived nurseries (ARCHITECTURE §6).

::

    Worker.serve
    ├── background nursery
    │   ├── heartbeat loop            absolute deadlines, every heartbeat-interval
    │   ├── lease recovery loop       every recovery-interval
    │   └── NOTIFY listener           (optional) wakes the poller
    └── jobs nursery                  outlives intake; its deadline is set at shutdown
        ├── intake scope
        │   └── poller                reserve free slots → one batch claim → hand slots to jobs
        └── one child nursery per claimed job
            ├── pipeline              parse/chunk → embed → complete, or a classified failure
            └── lease renewal loop    absolute deadlines; losing the lease cancels this job only

Invariants: at most ``max-concurrency`` jobs run; a slot is reserved before any claim and is
released exactly once, in a ``finally``, whatever ends the job; a job whose lease is lost is
cancelled and never writes again; one job's failure never touches another. Shutdown: stop
intake → STOPPING → wait up to the grace period → cancel what is left → STOPPED. Jobs are never
marked FAILED at shutdown: each cancelled job hands its claim back (fenced; the job is PENDING
at once and the cancelled attempt does not count), and if that write cannot be made, lease
recovery returns it to the queue later. Every write made while stopping — STOPPING, STOPPED, a
hand-back, a final failure report — is shielded from cancellation and bounded in time.

Drain (``serve(drain=True)``) returns only when no job of the worker's model is PENDING (due
now or later) and none is PROCESSING except under a live worker (RUNNING, heartbeat within
``heartbeat-timeout``); until then it waits for retries to come due and for the leases of
stopped or silent workers to expire, recovering them itself.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Protocol
from uuid import UUID

import attrs
import trio

from trioindex.config import WorkerSettings
from trioindex.errors import FailureType, OwnershipLost, StateInconsistent, StepFailure
from trioindex.values import (
    Claim,
    CompleteResult,
    DrainState,
    FailOutcome,
    FailResult,
    RecoveredJob,
    VersionStatus,
    WorkerStatus,
)
from trioindex.worker import metrics
from trioindex.worker.counters import WorkerCounters

logger = logging.getLogger(__name__)

# How long a bounded cleanup write (STOPPING/STOPPED, a hand-back, a final report) may take.
CLEANUP_TIMEOUT = 10.0
# How often a draining worker says what it is still waiting for.
DRAIN_LOG_INTERVAL = 15.0
# Pause before retrying a renewal that failed for a reason other than lost ownership.
RENEWAL_RETRY_PAUSE = 1.0


class Store(Protocol):
    """What the runtime needs from the job lifecycle (:class:`trioindex.worker.queue.JobStore`)."""

    async def register_worker(
        self, *, hostname: str, pid: int, version: str, max_concurrency: int
    ) -> UUID: ...
    async def heartbeat(self, worker_id: UUID) -> bool: ...
    async def set_worker_status(self, worker_id: UUID, status: WorkerStatus) -> None: ...
    async def claim(self, worker_id: UUID, k: int, model_id: UUID | None = None) -> list[Claim]: ...
    async def renew(self, claim: Claim) -> datetime: ...
    async def complete(self, claim: Claim) -> CompleteResult: ...
    async def fail(self, claim: Claim, failure_type: FailureType, message: str) -> FailResult: ...
    async def recover(self) -> list[RecoveredJob]: ...
    async def release(self, claim: Claim) -> None: ...
    async def drain_state(
        self, worker_id: UUID, model_id: UUID | None, heartbeat_timeout: float
    ) -> DrainState: ...


class Steps(Protocol):
    """The pipeline steps (:class:`trioindex.worker.steps.PipelineSteps`)."""

    async def parse(self, claim: Claim) -> int: ...
    async def embed(self, claim: Claim) -> int: ...


_PARSE_FIRST = frozenset({VersionStatus.UPLOADED, VersionStatus.PARSING})
_EMBEDDABLE = _PARSE_FIRST | {VersionStatus.CHUNKED, VersionStatus.EMBEDDING}


def steps_for(status: VersionStatus) -> tuple[str, ...]:
    """Which steps a claim runs, chosen by its version's status at claim time."""
    if status in _PARSE_FIRST:
        return ("parse", "embed", "complete")
    if status in _EMBEDDABLE:
        return ("embed", "complete")
    raise StateInconsistent(f"a claimed job's version is {status}; nothing can run")


@attrs.define(eq=False)
class JobContext:
    """One claim in flight. ``lease_deadline`` is a local, conservative estimate (Trio clock)."""

    claim: Claim
    lease_deadline: float
    scope: trio.CancelScope
    lost: bool = False
    step: str = "claim"
    # Set just before the final write (complete or fail). A renewal racing that write waits on
    # the job row lock and then finds the job finished: that is not a lost lease.
    finishing: bool = False


@attrs.define(eq=False)
class Worker:
    store: Store
    steps: Steps
    settings: WorkerSettings
    model_id: UUID | None = None
    counters: WorkerCounters = attrs.field(factory=WorkerCounters)
    version: str = "0"
    worker_id: UUID | None = None
    on_job_done: Callable[[Claim, str], None] | None = None
    listener: Callable[[Callable[[], None]], Awaitable[None]] | None = None
    _wakeup: trio.Event = attrs.field(factory=trio.Event)
    _intake: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    _slots: trio.CapacityLimiter | None = None
    _running: set[JobContext] = attrs.field(factory=set)
    _stop_requested: bool = False
    _drain_logged_at: float = -math.inf

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    # -- control ------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop claiming now; running jobs get the grace period. Safe to call more than once."""
        if not self._stop_requested:
            logger.info("worker %s: stop requested, no new claims", self.worker_id)
        self._stop_requested = True
        self._intake.cancel()

    def wake(self) -> None:
        """Wake the poller early (a NOTIFY arrived, or a slot was freed)."""
        self._wakeup.set()

    @property
    def running_jobs(self) -> int:
        return len(self._running)

    # -- the tree -----------------------------------------------------------------------------

    async def serve(
        self, *, drain: bool = False, task_status: trio.TaskStatus[UUID] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Register, then run until :meth:`request_stop` (or, with ``drain``, until idle)."""
        settings = self.settings
        self._slots = trio.CapacityLimiter(settings.max_concurrency)
        self.worker_id = await self.store.register_worker(
            hostname=socket.gethostname(),
            pid=os.getpid(),
            version=self.version,
            max_concurrency=settings.max_concurrency,
        )
        logger.info(
            "worker %s registered (max-concurrency %d)", self.worker_id, settings.max_concurrency
        )
        try:
            async with trio.open_nursery() as background:
                background.start_soon(self._heartbeat_loop)
                background.start_soon(self._recovery_loop)
                if self.listener is not None:
                    background.start_soon(self.listener, self.wake)
                async with trio.open_nursery() as jobs:
                    task_status.started(self.worker_id)
                    with self._intake:
                        await self._poll(jobs, drain=drain)
                    # intake has stopped: nothing new is claimed from here on
                    with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):
                        await self._set_status(WorkerStatus.STOPPING)
                    if self._running:
                        logger.info(
                            "worker %s: waiting up to %.1fs for %d running job(s)",
                            self.worker_id,
                            settings.shutdown_grace_period,
                            len(self._running),
                        )
                    jobs.cancel_scope.deadline = (
                        trio.current_time() + settings.shutdown_grace_period
                    )
                background.cancel_scope.cancel()
        finally:
            with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):
                await self._set_status(WorkerStatus.STOPPED)
            logger.info("worker %s stopped; counters %s", self.worker_id, self.counters.snapshot())

    async def _set_status(self, status: WorkerStatus) -> None:
        assert self.worker_id is not None
        try:
            await self.store.set_worker_status(self.worker_id, status)
        except Exception as exc:
            logger.warning(
                "worker %s: could not record %s: %s", self.worker_id, status, type(exc).__name__
            )

    # -- intake -------------------------------------------------------------------------------

    async def _poll(self, jobs: trio.Nursery, *, drain: bool) -> None:
        assert self._slots is not None and self.worker_id is not None
        slots = self._slots
        while True:
            first = object()
            await slots.acquire_on_behalf_of(first)  # a free slot before any claim
            reserved = [first]
            while slots.available_tokens > 0:
                token = object()
                slots.acquire_on_behalf_of_nowait(token)
                reserved.append(token)
            self._wakeup = trio.Event()
            claims: list[Claim] = []
            claim_failed = False
            try:
                # Shielded: a claim that committed must be handed to jobs, never dropped by a
                # stop request arriving mid-call (its rows would sit PROCESSING until expiry).
                with trio.CancelScope(shield=True):
                    claims = await self.store.claim(self.worker_id, len(reserved), self.model_id)
            except Exception as exc:
                claim_failed = True
                logger.warning("worker %s: claim failed: %s", self.worker_id, type(exc).__name__)
            finally:
                for token, claim in zip(reserved, claims, strict=False):
                    self._start_job(jobs, claim, token)
                for token in reserved[len(claims) :]:
                    slots.release_on_behalf_of(token)
            self.counters.polls += 1
            if claims and len(claims) == len(reserved):
                continue  # busy drain: every slot asked for was filled, claim again at once
            if not claims and not claim_failed:
                self.counters.empty_polls += 1
                logger.debug("worker %s: nothing to claim", self.worker_id)
                if drain and not self._running:
                    pause = await self._drain_pause()
                    if pause is None:
                        logger.info("worker %s: queue drained", self.worker_id)
                        return
                    await self._idle(pause)
                    continue
            await self._idle()

    def _start_job(self, jobs: trio.Nursery, claim: Claim, slot: object) -> None:
        self.counters.claimed += 1
        context = JobContext(
            claim=claim,
            lease_deadline=trio.current_time() + self.settings.lease_duration,
            scope=trio.CancelScope(),
        )
        self._running.add(context)
        metrics.record_slots(len(self._running), self.settings.max_concurrency)
        jobs.start_soon(self._run_job, context, slot, name=f"job {claim.job_id}")

    async def _idle(self, pause: float | None = None) -> None:
        """Wait for the polling interval (or ``pause``, if shorter), a NOTIFY, or a finished
        job — whichever is first."""
        interval = self.settings.polling_interval
        with trio.move_on_after(interval if pause is None else min(pause, interval)):
            await self._wakeup.wait()

    async def _drain_pause(self) -> float | None:
        """None when draining is done; otherwise how long to wait before claiming again.

        Called with nothing running and nothing claimable now. Expired leases of stopped or
        silent workers are recovered here and then, not at the next recovery tick.
        """
        assert self.worker_id is not None
        try:
            state = await self.store.drain_state(
                self.worker_id, self.model_id, self.settings.heartbeat_timeout
            )
        except Exception as exc:
            logger.warning(
                "worker %s: cannot check the queue for drain: %s",
                self.worker_id,
                type(exc).__name__,
            )
            return self.settings.polling_interval
        if state.drained:
            return None
        if state.expired_orphans:
            await self._recover_once()
            return 0.0
        self._log_drain_wait(state)
        return state.next_due_in

    def _log_drain_wait(self, state: DrainState) -> None:
        now = trio.current_time()
        if now - self._drain_logged_at < DRAIN_LOG_INTERVAL:
            return
        self._drain_logged_at = now
        due = "" if state.next_due_in is None else f"; next due in {state.next_due_in:.1f}s"
        logger.info(
            "worker %s: drain waiting for %d pending job(s) and %d job(s) held by stopped or "
            "silent workers (returned to the queue when their lease expires)%s",
            self.worker_id,
            state.scheduled,
            state.orphaned,
            due,
        )

    # -- one job ------------------------------------------------------------------------------

    async def _run_job(self, context: JobContext, slot: object) -> None:
        claim = context.claim
        outcome = "cancelled"
        started = trio.current_time()
        try:
            with context.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._renew_loop, context)
                    outcome = await self._execute(context)
                    nursery.cancel_scope.cancel()  # the final write is done: renewal stops last
            if context.lost and outcome == "cancelled":
                outcome = "lost"
                self.counters.lost += 1
        finally:
            if outcome == "cancelled" and not context.lost:
                outcome = await self._hand_back(context)
            self._running.discard(context)
            assert self._slots is not None
            self._slots.release_on_behalf_of(slot)
            self.wake()
            if outcome in ("cancelled", "released"):
                self.counters.cancelled += 1
            kind, _, failure_type = outcome.partition(":")
            metrics.record_job(kind, failure_type)
            metrics.record_slots(len(self._running), self.settings.max_concurrency)
            logger.info(
                "worker %s job %s attempt %s: %s after %.2fs (step %s)",
                claim.worker_id,
                claim.job_id,
                claim.attempt_id,
                outcome,
                trio.current_time() - started,
                context.step,
            )
            if self.on_job_done is not None:
                self.on_job_done(claim, outcome)

    async def _execute(self, context: JobContext) -> str:
        """Run the steps; classify and report a failure. Returns the outcome class."""
        claim = context.claim
        try:
            for step in steps_for(claim.version_status):
                context.step = step
                began = trio.current_time()
                if step == "parse":
                    await self.steps.parse(claim)
                elif step == "embed":
                    await self._embed(claim)
                else:
                    context.finishing = True
                    # shielded: the call is never abandoned anyway, and a completion that
                    # committed must be reported as such, not as a cancelled job
                    with trio.CancelScope(shield=True):
                        await self.store.complete(claim)
                metrics.record_step(step, trio.current_time() - began)
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
            return "lost"
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
        return "succeeded"

    async def _embed(self, claim: Claim) -> None:
        began = trio.current_time()
        try:
            await self.steps.embed(claim)
        except Exception as exc:
            metrics.record_embedding_call(type(exc).__name__, trio.current_time() - began)
            raise
        metrics.record_embedding_call("ok", trio.current_time() - began)

    async def _hand_back(self, context: JobContext) -> str:
        """Return a cancelled job's claim to the queue at once (shielded, bounded).

        "released" when the job is PENDING again; "cancelled" when the write was refused (the
        claim no longer owns the job) or could not be made — lease recovery owns it then.
        """
        claim = context.claim
        context.finishing = True  # a renewal racing the hand-back is not a lost lease
        with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):
            try:
                await self.store.release(claim)
            except OwnershipLost:
                logger.info(
                    "worker %s job %s: hand-back refused (the claim no longer owns the job)",
                    claim.worker_id,
                    claim.job_id,
                )
                return "cancelled"
            except Exception as exc:
                logger.warning(
                    "worker %s job %s: could not hand the job back (%s); lease recovery will",
                    claim.worker_id,
                    claim.job_id,
                    type(exc).__name__,
                )
                return "cancelled"
            return "released"
        logger.warning(
            "worker %s job %s: handing the job back timed out after %.0fs; lease recovery will",
            claim.worker_id,
            claim.job_id,
            CLEANUP_TIMEOUT,
        )
        return "cancelled"

    async def _report(self, context: JobContext, failure_type: FailureType, message: str) -> str:
        """Write a classified failure. Shielded and bounded: a failure found just as the job is
        cancelled (shutdown, a lost lease) is still reported, within ``CLEANUP_TIMEOUT``."""
        claim = context.claim
        context.finishing = True
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
        return "report-failed"

    async def _fail(self, claim: Claim, failure_type: FailureType, message: str) -> str:
        try:
            result = await self.store.fail(claim, failure_type, message)
        except OwnershipLost:
            self.counters.report_refused += 1
            logger.warning(
                "worker %s job %s: %s report refused (ownership lost); lease recovery owns it",
                claim.worker_id,
                claim.job_id,
                failure_type,
            )
            return "report-refused"
        except Exception as exc:
            self.counters.report_refused += 1
            logger.warning(
                "worker %s job %s: could not report %s (%s); lease recovery will retry it",
                claim.worker_id,
                claim.job_id,
                failure_type,
                type(exc).__name__,
            )
            return "report-failed"
        if result.outcome is FailOutcome.RETRY_SCHEDULED:
            self.counters.retried += 1
            return f"retry:{failure_type}"
        self.counters.failed += 1
        return f"failed:{failure_type}"

    async def _renew_loop(self, context: JobContext) -> None:
        """Renew on absolute deadlines; a refused renewal cancels this job's scope only."""
        interval = self.settings.lease_renewal_interval
        next_at = trio.current_time() + interval
        while True:
            await trio.sleep_until(next_at)
            if context.finishing:
                return  # the final write is under way; it re-validates ownership itself
            try:
                await self.store.renew(context.claim)
            except OwnershipLost:
                if context.finishing:
                    return  # raced the final write, which finished the job: not a loss
                context.lost = True
                metrics.record_renewal("refused")
                metrics.record_lease_lost()
                logger.warning(
                    "worker %s job %s: lease renewal refused; cancelling the job",
                    context.claim.worker_id,
                    context.claim.job_id,
                )
                context.scope.cancel()
                return
            except Exception as exc:
                self.counters.renewal_errors += 1
                metrics.record_renewal("error")
                now = trio.current_time()
                if now >= context.lease_deadline:
                    context.lost = True
                    metrics.record_lease_lost()
                    logger.warning(
                        "worker %s job %s: lease expired while renewal kept failing (%s)",
                        context.claim.worker_id,
                        context.claim.job_id,
                        type(exc).__name__,
                    )
                    context.scope.cancel()
                    return
                next_at = min(now + RENEWAL_RETRY_PAUSE, context.lease_deadline)
                continue
            self.counters.renewals += 1
            metrics.record_renewal("ok")
            # the database extended the lease from "now"; our estimate follows conservatively
            context.lease_deadline = trio.current_time() + self.settings.lease_duration
            next_at += interval * max(1, math.ceil((trio.current_time() - next_at) / interval))

    # -- background loops -----------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        assert self.worker_id is not None
        await self._every(self.settings.heartbeat_interval, self._heartbeat_once)

    async def _heartbeat_once(self) -> None:
        assert self.worker_id is not None
        try:
            if not await self.store.heartbeat(self.worker_id):
                logger.warning("worker %s: heartbeat found the worker row stopped", self.worker_id)
        except Exception as exc:
            logger.warning("worker %s: heartbeat failed: %s", self.worker_id, type(exc).__name__)

    async def _recovery_loop(self) -> None:
        await self._every(self.settings.recovery_interval, self._recover_once, first_now=True)

    async def _recover_once(self) -> None:
        try:
            recovered = await self.store.recover()
        except Exception as exc:
            logger.warning(
                "worker %s: lease recovery failed: %s", self.worker_id, type(exc).__name__
            )
            return
        if recovered:
            self.counters.recovered += len(recovered)
            metrics.record_recovered(len(recovered))
            logger.info(
                "worker %s: recovered %d expired lease(s): %s",
                self.worker_id,
                len(recovered),
                ", ".join(f"{r.job_id} -> {r.outcome}" for r in recovered),
            )
            self.wake()

    @staticmethod
    async def _every(
        period: float, action: Callable[[], Awaitable[None]], *, first_now: bool = False
    ) -> None:
        start = trio.current_time()
        n = 0 if first_now else 1
        while True:
            await trio.sleep_until(start + n * period)
            await action()
            # skip ticks missed while the action ran long, keeping the absolute schedule
            n = max(n + 1, math.floor((trio.current_time() - start) / period) + 1)


async def serve_until_signalled(worker: Worker, *, drain: bool = False) -> None:
    """Run ``worker`` under a signal watcher: the first SIGTERM/SIGINT stops intake and starts
    the grace period; a second one cancels everything at once (STOPPED is still written)."""
    async with trio.open_nursery() as root:
        root.start_soon(_watch_signals, worker, root.cancel_scope)
        await worker.serve(drain=drain)
        root.cancel_scope.cancel()


async def _watch_signals(worker: Worker, root: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            if worker.stop_requested:
                logger.warning("second %s: exiting at once", signal.Signals(signum).name)
                root.cancel()
                return
            logger.info(
                "%s: stopping intake, grace period %.1fs",
                signal.Signals(signum).name,
                worker.settings.shutdown_grace_period,
            )
            worker.request_stop()
