"""The worker-wide lease renewer: one task renews the leases of every job the worker holds.

A job is held from its claim until its final write: :meth:`LeaseRenewer.hold` when the job
starts, :meth:`LeaseRenewer.drop` when its steps end. :meth:`LeaseRenewer.serve` runs in the
worker's background nursery (which outlives every job) and sleeps until the earliest renewal
falls due; it then renews, in one statement (:meth:`LeaseWrites.renew_many`, one thread call,
one transaction), that job and every other one due within the next half interval, so each job
is renewed at least every ``lease-renewal-interval`` (and at most twice as often), whatever the
number of jobs: no task, nursery or timer per job.

What one job's result does is what a renewal of that job alone did: a success extends the
local lease estimate; a refusal (the claim no longer owns the job) cancels that job's scope
only, unless the job's final write is under way (that write re-validates ownership itself, and
a renewal racing it is refused once it has finished the job: not a lost lease); a job that no
longer exists (its document deleted or its model removed) ends quietly. A failed call (a
database error) is retried every ``RENEWAL_RETRY_PAUSE`` for each job it held until that job's
lease would have expired, and then the job is cancelled as lost.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

import attrs
import trio

from trioindex.config import WorkerSettings
from trioindex.errors import JobRemoved
from trioindex.values import Claim
from trioindex.worker import metrics
from trioindex.worker.counters import WorkerCounters

logger = logging.getLogger(__name__)

# Pause before retrying a renewal that failed for a reason other than lost ownership.
RENEWAL_RETRY_PAUSE = 1.0


class LeaseWrites(Protocol):
    """The renewal write (:class:`trioindex.worker.queue.JobQueue`): one result per claim, in
    order, the new expiry or the exception refusing that claim alone."""

    async def renew_many(self, claims: Sequence[Claim]) -> list[datetime | Exception]: ...


class HeldLease(Protocol):
    """What the renewer reads and sets on one job (:class:`trioindex.worker.job.JobContext`)."""

    claim: Claim
    lease_deadline: float  # local, conservative estimate (Trio clock)
    renew_at: float
    scope: trio.CancelScope
    lost: bool
    removed: bool
    finishing: bool


@attrs.define(eq=False)
class LeaseRenewer:
    """Renews the leases of the jobs held; see the module docstring."""

    queue: LeaseWrites
    settings: WorkerSettings
    counters: WorkerCounters
    _held: dict[HeldLease, None] = attrs.field(factory=dict, init=False)

    @property
    def held(self) -> int:
        return len(self._held)

    def hold(self, job: HeldLease) -> None:
        """Renew ``job``'s lease from now on; its first renewal is due an interval from now."""
        job.renew_at = trio.current_time() + self.settings.lease_renewal_interval
        self._held[job] = None

    def drop(self, job: HeldLease) -> None:
        """Stop renewing ``job``'s lease (its steps have ended). Safe to call more than once."""
        self._held.pop(job, None)

    async def serve(self) -> None:
        """Renew what falls due until cancelled (after the worker's last job)."""
        interval = self.settings.lease_renewal_interval
        while True:
            # A job held later falls due later than every renewal already scheduled (each is
            # set to "now + interval"), so sleeping until the earliest due one misses none.
            due = [job.renew_at for job in self._held if self._renewing(job)]
            await trio.sleep_until(min(due) if due else trio.current_time() + interval)
            await self.renew_due()

    @staticmethod
    def _renewing(job: HeldLease) -> bool:
        return not (job.finishing or job.lost)

    async def renew_due(self) -> None:
        """Renew, in one call, every held job due within the next half interval."""
        horizon = trio.current_time() + self.settings.lease_renewal_interval / 2
        jobs = [job for job in self._held if self._renewing(job) and job.renew_at <= horizon]
        if not jobs:
            return
        sent = trio.current_time()
        try:
            results = await self.queue.renew_many([job.claim for job in jobs])
        except Exception as exc:
            for job in jobs:
                self._failed(job, exc)
            return
        now = trio.current_time()
        for job, result in zip(jobs, results, strict=True):
            if isinstance(result, Exception):
                self._refused(job, result)
                continue
            self.counters.renewals += 1
            metrics.record_renewal("ok")
            # the database extended the lease from its "now"; our estimate follows conservatively
            job.lease_deadline = now + self.settings.lease_duration
            job.renew_at = sent + self.settings.lease_renewal_interval

    def _refused(self, job: HeldLease, refusal: Exception) -> None:
        if job.finishing or job not in self._held:
            return  # raced the final write, which finished the job: not a loss
        job.lost = True
        job.scope.cancel()
        if isinstance(refusal, JobRemoved):
            job.removed = True  # no fault: the job says so when it ends
            return
        metrics.record_renewal("refused")
        metrics.record_lease_lost()
        logger.warning(
            "worker %s job %s: lease renewal refused; cancelling the job",
            job.claim.worker_id,
            job.claim.job_id,
        )

    def _failed(self, job: HeldLease, error: Exception) -> None:
        self.counters.renewal_errors += 1
        metrics.record_renewal("error")
        if job.finishing or job not in self._held:
            return
        now = trio.current_time()
        if now >= job.lease_deadline:
            job.lost = True
            metrics.record_lease_lost()
            logger.warning(
                "worker %s job %s: lease expired while renewal kept failing (%s)",
                job.claim.worker_id,
                job.claim.job_id,
                type(error).__name__,
            )
            job.scope.cancel()
            return
        job.renew_at = min(now + RENEWAL_RETRY_PAUSE, job.lease_deadline)
