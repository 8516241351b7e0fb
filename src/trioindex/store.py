"""The async facade over the job lifecycle: what the worker runtime calls.

Each method runs one synchronous lifecycle function (one transaction) through
:meth:`Database.run`, the only place database work enters a thread. Policy values that never
change for a worker — lease duration, retry backoff — are bound here once.
"""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from trioindex import lifecycle
from trioindex.database import Database
from trioindex.errors import FailureType
from trioindex.values import (
    BackoffPolicy,
    Claim,
    CompleteResult,
    FailResult,
    RecoveredJob,
    WorkerStatus,
)


class JobStore:
    def __init__(self, db: Database, *, lease_seconds: float, backoff: BackoffPolicy) -> None:
        self.db = db
        self.lease_seconds = lease_seconds
        self.backoff = backoff

    async def register_worker(
        self, *, hostname: str, pid: int, version: str, max_concurrency: int
    ) -> UUID:
        return await self.db.run(
            lifecycle.register_worker,
            hostname=hostname,
            pid=pid,
            version=version,
            max_concurrency=max_concurrency,
        )

    async def heartbeat(self, worker_id: UUID) -> bool:
        return await self.db.run(lifecycle.heartbeat, worker_id)

    async def set_worker_status(self, worker_id: UUID, status: WorkerStatus) -> None:
        await self.db.run(lifecycle.set_worker_status, worker_id, status)

    async def claim(self, worker_id: UUID, k: int, model_id: UUID | None = None) -> list[Claim]:
        return await self.db.run(
            lifecycle.claim_jobs, worker_id, k, self.lease_seconds, model_id=model_id
        )

    async def renew(self, claim: Claim) -> datetime:
        return await self.db.run(lifecycle.renew_lease, claim, self.lease_seconds)

    async def complete(self, claim: Claim) -> CompleteResult:
        return await self.db.run(lifecycle.complete_job, claim)

    async def fail(self, claim: Claim, failure_type: FailureType, message: str) -> FailResult:
        return await self.db.run(lifecycle.fail_job, claim, failure_type, message, self.backoff)

    async def recover(self) -> list[RecoveredJob]:
        return await self.db.run(lifecycle.recover_expired, self.backoff)
