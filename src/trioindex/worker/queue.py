"""The job queue: the async facade over the job lifecycle that the worker runtime calls.

Each method runs one synchronous lifecycle function (one transaction) through
:meth:`Database.run`, the only place database work enters a thread. Policy values that never
change for a worker — lease duration, retry backoff — are bound here once.

Completions are gathered: :meth:`JobQueue.complete` hands its claim to a
:class:`~trioindex.worker.committer.GroupCommitter` that completes the claims of many jobs in
one transaction and one thread call (:func:`trioindex.db.jobs.complete_many`), each job fenced
and refused on its own. :meth:`JobQueue.serve` runs that committer; the worker runtime starts
it in its background nursery, which outlives every job.

A worker's own upkeep statements — claims, heartbeats, lease recovery, drain checks — take
turns (one :class:`trio.Lock`): they come from separate timers that often fire together, and
each is a millisecond's statement, so taking turns costs a claim at most one such statement
while it keeps an idle worker on the pool's one connection (two at once would make the pool
open a second, kept for ``database.pool-max-idle`` and opened again at the next coincidence).
Jobs' own writes (completions, steps, lease renewals) do not wait for it.

The writes a worker makes while it stops — its STOPPING/STOPPED status, handing claims back,
a final failure report — go through :meth:`Database.run_bounded`: they give up after
``cleanup_timeout`` seconds even when PostgreSQL is down or hangs (lease recovery then owns
whatever they could not write).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Concatenate, ParamSpec, TypeVar
from uuid import UUID

import trio

from trioindex.db import jobs as lifecycle
from trioindex.db.pool import Connection, Database
from trioindex.errors import FailureType
from trioindex.values import (
    BackoffPolicy,
    Claim,
    CompleteResult,
    DrainState,
    FailResult,
    RecoveredJob,
    WorkerStatus,
)
from trioindex.worker.committer import GroupCommitter
from trioindex.worker.job import CLEANUP_TIMEOUT

P = ParamSpec("P")
T = TypeVar("T")


class JobQueue:
    """The queue a worker claims jobs from and reports them to (see the module docstring)."""

    def __init__(
        self,
        db: Database,
        *,
        lease_seconds: float,
        backoff: BackoffPolicy,
        cleanup_timeout: float = CLEANUP_TIMEOUT,
    ) -> None:
        self.db = db
        self.lease_seconds = lease_seconds
        self.backoff = backoff
        self.cleanup_timeout = cleanup_timeout
        # No linger: jobs that finish together submit in the same scheduler pass, before the
        # committer's task runs, so they form one group anyway; a late one goes with the next.
        self.completions: GroupCommitter[Claim, CompleteResult] = GroupCommitter(
            "completion", db, lifecycle.complete_many, linger=0.0
        )
        self._upkeep = trio.Lock()

    async def _upkeep_run(
        self, fn: Callable[Concatenate[Connection, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """:meth:`Database.run` for an upkeep statement, one at a time (module docstring)."""
        async with self._upkeep:
            return await self.db.run(fn, *args, **kwargs)

    async def serve(self) -> None:
        """Run the completion committer until cancelled (after the worker's last job)."""
        await self.completions.serve()

    async def register_worker(
        self, *, hostname: str, pid: int, version: str, max_concurrency: int, chunking: str
    ) -> UUID:
        return await self.db.run(
            lifecycle.register_worker,
            hostname=hostname,
            pid=pid,
            version=version,
            max_concurrency=max_concurrency,
            chunking=chunking,
        )

    async def heartbeat(self, worker_id: UUID) -> bool:
        return await self._upkeep_run(lifecycle.heartbeat, worker_id)

    async def set_worker_status(self, worker_id: UUID, status: WorkerStatus) -> None:
        await self.db.run_bounded(
            self.cleanup_timeout, lifecycle.set_worker_status, worker_id, status
        )

    async def claim(self, worker_id: UUID, k: int, model_id: UUID | None = None) -> list[Claim]:
        return await self._upkeep_run(
            lifecycle.claim_jobs, worker_id, k, self.lease_seconds, model_id=model_id
        )

    async def renew_many(self, claims: Sequence[Claim]) -> list[datetime | Exception]:
        return await self.db.run(lifecycle.renew_leases, claims, self.lease_seconds)

    async def complete(self, claim: Claim) -> CompleteResult:
        return await self.completions.submit(claim)

    async def fail(self, claim: Claim, failure_type: FailureType, message: str) -> FailResult:
        return await self.db.run_bounded(
            self.cleanup_timeout, lifecycle.fail_job, claim, failure_type, message, self.backoff
        )

    async def release(self, claim: Claim) -> None:
        await self.db.run_bounded(self.cleanup_timeout, lifecycle.release_job, claim)

    async def recover(self) -> list[RecoveredJob]:
        return await self._upkeep_run(lifecycle.recover_expired, self.backoff)

    async def drain_state(
        self, worker_id: UUID, model_id: UUID | None, heartbeat_timeout: float
    ) -> DrainState:
        return await self._upkeep_run(
            lifecycle.drain_state,
            model_id,
            heartbeat_timeout=heartbeat_timeout,
            exclude=worker_id,
        )
