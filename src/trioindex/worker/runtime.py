"""The worker runtime: the root, background and jobs nurseries of one worker.

::

    Worker.serve                      one run: registers, then owns this tree until it ends
    ├── background nursery
    │   ├── heartbeat loop            absolute deadlines, every heartbeat-interval
    │   ├── lease recovery loop       every recovery-interval
    │   ├── lease renewer             every lease the worker holds, one statement per renewal
    │   ├── queue's worker-wide task  the completion committer (worker/queue.py)
    │   ├── steps' worker-wide tasks  embedding coalescer, group committers (worker/wiring.py)
    │   └── NOTIFY listener           (optional) wakes the poller
    └── jobs nursery                  outlives intake; its deadline is set at shutdown
        ├── intake scope
        │   └── poller                a free slot → one claim for the free slots → a slot a job
        └── one task per claimed job  JobRunner.run, in worker/job.py: its own cancel scope
            └── pipeline              parse/chunk → embed → complete, or a classified failure
                                      (a refused renewal cancels this job's scope only)

Invariants: at most ``max-concurrency`` jobs run their steps, and at most twice as many more
wait for their completion to commit (a job moves from its slot to a finishing place just before
its completion, so the next claim need not wait for that commit); a claim asks for no more jobs
than there are free slots, one of them taken before it is sent (only the poller takes slots, so
the others are still free when its jobs arrive), and the place a job holds is released exactly
once, in a ``finally``, whatever ends it; a job whose lease is lost is cancelled and never writes
again; one job's failure never touches another. Shutdown: stop intake → STOPPING → wait up to
the grace period → cancel what is left → STOPPED. Jobs are never marked FAILED at shutdown: each
cancelled job hands its claim back (fenced; the job is PENDING at once and the cancelled attempt
does not count), and if that write cannot be made, lease recovery returns it to the queue later.
Every write made while stopping — STOPPING, STOPPED, a hand-back, a final failure report — is
shielded from cancellation and bounded in time.

When the poller claims: at once again after a claim that filled every slot it asked for
(after waiting up to ``CLAIM_LINGER`` for a quarter of the slots to free up); after one that
returned fewer jobs than it asked for (none included), only on a NOTIFY, recovered leases or
the polling interval (``LISTENING_POLL_FACTOR`` times as long while the LISTEN connection is
up) — and, in a drain, the worker's last running job ending. Such a claim found no other row
it could take: a job freeing its slot says nothing about that queue. In a fleet the workers
that hold the last jobs of a backlog would otherwise each claim again, finding nothing, as
every job of theirs ends (docs/test-results/fleet.md, run 14), and a worker fed documents one
at a time would make an empty claim after each (run 33).

Drain (``serve(drain=True)``) returns only when no job of the worker's model is PENDING (due
now or later) and none is PROCESSING except under a live worker (RUNNING, heartbeat within
``heartbeat-timeout``); until then it waits for retries to come due and for the leases of
stopped or silent workers to expire, recovering them itself.

A :class:`Worker` is complete when built; what belongs to one ``serve()`` call — the worker id
it registered, its slots, the running jobs, the poller's wake-up event, the intake scope — lives
in a :class:`~trioindex.worker.serve_run.ServeRun` made once registration returns, so a worker
can be served again. How each job runs, and the :class:`~trioindex.worker.job.JobOutcome` it
ends with, is :mod:`trioindex.worker.job`. docs/design/architecture.md ("The Trio runtime")
walks the tree.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from typing import Protocol
from uuid import UUID

import attrs
import trio

from trioindex.config import WorkerSettings
from trioindex.errors import ModelRemoved
from trioindex.values import CHARACTER_CHUNKING, Claim, DrainState, RecoveredJob, WorkerStatus
from trioindex.worker import metrics
from trioindex.worker.counters import WorkerCounters
from trioindex.worker.job import (
    CLEANUP_TIMEOUT,
    JobContext,
    JobOutcome,
    JobRunner,
    JobWrites,
    Steps,
)
from trioindex.worker.leases import LeaseRenewer
from trioindex.worker.serve_run import JobPlace, ServeRun

logger = logging.getLogger(__name__)

# How often a draining worker says what it is still waiting for.
DRAIN_LOG_INTERVAL = 15.0
# While every slot is busy, how long the poller waits for a quarter of the slots to free up
# before claiming fewer (one claim statement for several jobs).
CLAIM_LINGER = 0.02
# Finishing places per slot. With two, the completions of two full claims can commit at once
# (the completion committer runs two groups in flight), so a claim's jobs need not wait for
# the previous group's commit; with one, completions were written one group at a time
# (docs/test-results/queue.md: 1.4x the no-op jobs/s). Large documents stay bounded by the
# document budget, whatever the places.
FINISHING_PLACES_PER_SLOT = 2
# While the LISTEN connection is up the idle poller claims this many times less often: every
# enqueue, hand-back and retry request NOTIFYs, so a poll alone finds only retries coming due,
# and each idle worker's empty claim a second cost PostgreSQL a read of the claim index's dead
# and locked entries (docs/test-results/fleet.md, run 17).
LISTENING_POLL_FACTOR = 5


class Queue(JobWrites, Protocol):
    """What the runtime needs from the job queue (:class:`trioindex.worker.queue.JobQueue`)."""

    async def register_worker(
        self, *, hostname: str, pid: int, version: str, max_concurrency: int, chunking: str
    ) -> UUID: ...
    async def heartbeat(self, worker_id: UUID) -> bool: ...
    async def set_worker_status(self, worker_id: UUID, status: WorkerStatus) -> None: ...
    async def claim(self, worker_id: UUID, k: int, model_id: UUID | None = None) -> list[Claim]: ...
    async def recover(self) -> list[RecoveredJob]: ...
    async def drain_state(
        self, worker_id: UUID, model_id: UUID | None, heartbeat_timeout: float
    ) -> DrainState: ...
    async def serve(self) -> None: ...


@attrs.define(eq=False)
class Worker:
    """A worker: its job queue, steps and settings. :meth:`serve` runs it (again if called
    again); ``on_job_done`` hears how every job ended."""

    queue: Queue
    steps: Steps
    settings: WorkerSettings
    model_id: UUID | None = None
    # the chunk set this worker's chunker makes; its claims carry it
    chunking: str = CHARACTER_CHUNKING
    counters: WorkerCounters = attrs.field(factory=WorkerCounters)
    version: str = "0"
    on_job_done: Callable[[Claim, JobOutcome], None] | None = None
    # set when a claim found the worker's model removed: the run stopped for that
    model_removed: bool = attrs.field(default=False, init=False)
    # runs the LISTEN connection: called with the wake-up (each NOTIFY) and with what to call
    # when a LISTEN is in place (True) or its connection is lost (False)
    listener: Callable[[Callable[[], None], Callable[[bool], None]], Awaitable[None]] | None = None
    # the current run, or the last one once serve() has returned; None before the first
    _run: ServeRun | None = attrs.field(default=None, init=False)
    # a stop asked for the current run, or (asked before it registered) for the next one
    _stop_requested: bool = attrs.field(default=False, init=False)

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    @property
    def worker_id(self) -> UUID | None:
        """The id the current (or last) run registered; None before the first registration."""
        return None if self._run is None else self._run.worker_id

    @property
    def running_jobs(self) -> int:
        return 0 if self._run is None else len(self._run.running)

    # -- control ------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop claiming now; running jobs get the grace period. Safe to call more than once,
        and before :meth:`serve` (the run then claims nothing)."""
        if not self._stop_requested:
            logger.info("worker %s: stop requested, no new claims", self.worker_id)
        self._stop_requested = True
        if self._run is not None:
            self._run.intake.cancel()

    def wake(self) -> None:
        """Wake the poller early: jobs may be claimable (a NOTIFY arrived)."""
        if self._run is not None:
            self._run.wake()

    def listening(self, live: bool) -> None:
        """The LISTEN connection is in place (True) or lost (False)."""
        if self._run is not None:
            self._run.set_listening(live)

    # -- the tree -----------------------------------------------------------------------------

    async def serve(
        self, *, drain: bool = False, task_status: trio.TaskStatus[UUID] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Register, then run until :meth:`request_stop` (or, with ``drain``, until idle)."""
        settings = self.settings
        worker_id = await self.queue.register_worker(
            hostname=socket.gethostname(),
            pid=os.getpid(),
            version=self.version,
            max_concurrency=settings.max_concurrency,
            chunking=self.chunking,
        )
        logger.info(
            "worker %s registered (max-concurrency %d)", worker_id, settings.max_concurrency
        )
        run = self._run = ServeRun(
            worker_id=worker_id,
            drain=drain,
            slots=trio.CapacityLimiter(settings.max_concurrency),
            finishing=trio.CapacityLimiter(FINISHING_PLACES_PER_SLOT * settings.max_concurrency),
            jobs=JobRunner(
                self.queue,
                self.steps,
                settings,
                self.counters,
                LeaseRenewer(self.queue, settings, self.counters),
            ),
        )
        if self._stop_requested:
            run.intake.cancel()  # asked before registration returned
        # read when scraped, from the start (not after a first job): the jobs in slots, not
        # those in finishing places nor the slot taken for a claim in flight
        metrics.watch_slots(
            lambda: len(run.running) - run.finishing.borrowed_tokens, settings.max_concurrency
        )
        try:
            async with trio.open_nursery() as background:
                background.start_soon(self._heartbeat_loop, run)
                background.start_soon(self._recovery_loop, run)
                background.start_soon(run.jobs.leases.serve)
                background.start_soon(self.queue.serve)
                background.start_soon(self.steps.serve)
                if self.listener is not None:
                    background.start_soon(self.listener, self.wake, self.listening)
                async with trio.open_nursery() as jobs:
                    task_status.started(worker_id)
                    self._log_ready(run, drain=drain)
                    with run.intake:
                        await self._poll(run, jobs, drain=drain)
                    # intake has stopped: nothing new is claimed from here on
                    with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):
                        await self._set_status(run, WorkerStatus.STOPPING)
                    if run.running:
                        logger.info(
                            "worker %s: waiting up to %.1fs for %d running job(s)",
                            worker_id,
                            settings.shutdown_grace_period,
                            len(run.running),
                        )
                    jobs.cancel_scope.deadline = (
                        trio.current_time() + settings.shutdown_grace_period
                    )
                background.cancel_scope.cancel()
        finally:
            with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):
                await self._set_status(run, WorkerStatus.STOPPED)
            self._stop_requested = False  # it was this run's; a later serve() starts afresh
            logger.info("worker %s stopped; counters %s", worker_id, self.counters.snapshot())

    def _log_ready(self, run: ServeRun, *, drain: bool) -> None:
        """Once per run, when the background tasks are started and the first poll is next."""
        if run.intake.cancel_called:
            return  # stopped before it started: it claims nothing
        interval = self.settings.polling_interval
        polls = f"every {interval:.1f}s"
        if self.listener is not None:
            listening = interval * LISTENING_POLL_FACTOR
            polls = f"NOTIFY or every {listening:.1f}s while listening, {polls} otherwise"
        logger.info(
            "worker %s ready: waiting for jobs (max-concurrency %d; claims on %s%s)",
            run.worker_id,
            self.settings.max_concurrency,
            polls,
            "; exits once the queue is drained" if drain else "",
        )

    async def _set_status(self, run: ServeRun, status: WorkerStatus) -> None:
        try:
            await self.queue.set_worker_status(run.worker_id, status)
        except Exception as exc:
            logger.warning(
                "worker %s: could not record %s: %s", run.worker_id, status, type(exc).__name__
            )

    # -- intake -------------------------------------------------------------------------------

    async def _poll(self, run: ServeRun, jobs: trio.Nursery, *, drain: bool) -> None:
        slots = run.slots
        busy = False
        while True:
            if busy:
                await self._gather_slots(run)
            first = object()
            await slots.acquire_on_behalf_of(first)  # a free slot before any claim
            # Only this task takes slots: the ones free now stay free while the claim is in
            # flight, so each claimed job after the first takes one then (taking them all first
            # would cost every claim two limiter calls a slot, however few jobs it returns).
            wanted = 1 + int(slots.available_tokens)
            run.wakeup = trio.Event()
            run.notified = False
            claims: list[Claim] = []
            claim_failed = False
            try:
                # Shielded: a claim that committed must be handed to jobs, never dropped by a
                # stop request arriving mid-call (its rows would sit PROCESSING until expiry).
                with trio.CancelScope(shield=True):
                    claims = await self.queue.claim(run.worker_id, wanted, self.model_id)
            except ModelRemoved as exc:
                logger.error("worker %s: stopping: %s", run.worker_id, exc)
                self.model_removed = True
                return  # the finally below frees the slots; serve then stops as after a drain
            except Exception as exc:
                claim_failed = True
                logger.warning("worker %s: claim failed: %s", run.worker_id, type(exc).__name__)
            finally:
                for index, claim in enumerate(claims):
                    token = first if index == 0 else object()
                    if index:
                        slots.acquire_on_behalf_of_nowait(token)
                    self._start_job(run, jobs, claim, token)
                if not claims:
                    slots.release_on_behalf_of(first)
            self.counters.polls += 1
            # fewer jobs than asked for: the statement found no other row it could take
            run.queue_empty = len(claims) < wanted and not claim_failed and not run.notified
            if run.queue_empty:
                run.wakeup = trio.Event()  # slots freed during the claim say nothing of the queue
            busy = bool(claims) and len(claims) == wanted
            if busy:
                continue  # busy drain: every slot asked for was filled, claim again at once
            if not claims and not claim_failed:
                self.counters.empty_polls += 1
                logger.debug("worker %s: nothing to claim", run.worker_id)
                if drain and not run.running:
                    pause = await self._drain_pause(run)
                    if pause is None:
                        logger.info("worker %s: queue drained", run.worker_id)
                        return
                    await self._idle(run, pause)
                    continue
            await self._idle(run)

    async def _gather_slots(self, run: ServeRun) -> None:
        """While busy, let a few slots free up (at most ``CLAIM_LINGER``) so one claim fills
        several: jobs finishing in the same group commit free their slots together. Nothing is
        reserved while waiting, so a stop request finds nothing to release."""
        wanted = self.settings.max_concurrency // 4
        with trio.move_on_after(CLAIM_LINGER):
            while run.slots.available_tokens < wanted:
                run.wakeup = trio.Event()
                await run.wakeup.wait()

    def _start_job(self, run: ServeRun, jobs: trio.Nursery, claim: Claim, slot: object) -> None:
        self.counters.claimed += 1
        place = JobPlace(run.slots, slot)
        context = JobContext(
            claim=claim,
            lease_deadline=trio.current_time() + self.settings.lease_duration,
            scope=trio.CancelScope(),
            before_completion=functools.partial(self._to_finishing, run, place),
        )
        run.running.add(context)
        jobs.start_soon(self._run_job, run, context, place, name=f"job {claim.job_id}")

    async def _to_finishing(self, run: ServeRun, place: JobPlace) -> None:
        """Give the job's slot to the next claim while its completion is written (at most
        twice ``max-concurrency`` completions at a time: a job waits here, in its slot, for
        one)."""
        await place.move_to(run.finishing)
        run.slot_freed()

    async def _run_job(self, run: ServeRun, context: JobContext, place: JobPlace) -> None:
        try:
            await run.jobs.run(context)
        finally:
            run.running.discard(context)
            place.release()
            run.slot_freed()
            if self.on_job_done is not None:
                self.on_job_done(context.claim, context.outcome)

    async def _idle(self, run: ServeRun, pause: float | None = None) -> None:
        """Wait for the polling interval (``LISTENING_POLL_FACTOR`` times as long while the
        LISTEN connection is up; ``pause``, if shorter), a NOTIFY, or a finished job —
        whichever is first."""
        interval = self.settings.polling_interval
        if run.listening:
            interval *= LISTENING_POLL_FACTOR
        with trio.move_on_after(interval if pause is None else min(pause, interval)):
            await run.wakeup.wait()

    async def _drain_pause(self, run: ServeRun) -> float | None:
        """None when draining is done; otherwise how long to wait before claiming again.

        Called with nothing running and nothing claimable now. Expired leases of stopped or
        silent workers are recovered here and then, not at the next recovery tick.
        """
        try:
            state = await self.queue.drain_state(
                run.worker_id, self.model_id, self.settings.heartbeat_timeout
            )
        except Exception as exc:
            logger.warning(
                "worker %s: cannot check the queue for drain: %s",
                run.worker_id,
                type(exc).__name__,
            )
            return self.settings.polling_interval
        if state.drained:
            return None
        if state.expired_orphans:
            await self._recover_once(run)
            return 0.0
        self._log_drain_wait(run, state)
        return state.next_due_in

    def _log_drain_wait(self, run: ServeRun, state: DrainState) -> None:
        now = trio.current_time()
        if now - run.drain_logged_at < DRAIN_LOG_INTERVAL:
            return
        run.drain_logged_at = now
        due = "" if state.next_due_in is None else f"; next due in {state.next_due_in:.1f}s"
        logger.info(
            "worker %s: drain waiting for %d pending job(s) and %d job(s) held by stopped or "
            "silent workers (returned to the queue when their lease expires)%s",
            run.worker_id,
            state.scheduled,
            state.orphaned,
            due,
        )

    # -- background loops -----------------------------------------------------------------------

    async def _heartbeat_loop(self, run: ServeRun) -> None:
        heartbeat = functools.partial(self._heartbeat_once, run)
        await self._every(self.settings.heartbeat_interval, heartbeat)

    async def _heartbeat_once(self, run: ServeRun) -> None:
        try:
            if not await self.queue.heartbeat(run.worker_id):
                logger.warning("worker %s: heartbeat found the worker row stopped", run.worker_id)
        except Exception as exc:
            logger.warning("worker %s: heartbeat failed: %s", run.worker_id, type(exc).__name__)

    async def _recovery_loop(self, run: ServeRun) -> None:
        recover = functools.partial(self._recover_once, run)
        await self._every(self.settings.recovery_interval, recover, first_now=True)

    async def _recover_once(self, run: ServeRun) -> None:
        try:
            recovered = await self.queue.recover()
        except Exception as exc:
            logger.warning(
                "worker %s: lease recovery failed: %s", run.worker_id, type(exc).__name__
            )
            return
        if recovered:
            self.counters.recovered += len(recovered)
            metrics.record_recovered(len(recovered))
            logger.info(
                "worker %s: recovered %d expired lease(s): %s",
                run.worker_id,
                len(recovered),
                ", ".join(f"{r.job_id} -> {r.outcome}" for r in recovered),
            )
            run.wake()

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
