"""In-memory fakes of the job queue and the pipeline steps, for deterministic runtime tests.

They keep a log of every call with the Trio clock's time, so tests assert ordering and
timing under ``autojump_clock`` without any real I/O (threads and sockets would let virtual time
jump under them).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from uuid import UUID

import attrs
import trio

from trioindex.errors import FailureType, OwnershipLost
from trioindex.values import (
    Claim,
    CompleteResult,
    DrainState,
    FailOutcome,
    FailResult,
    RecoveredJob,
    WorkerStatus,
)


def make_claim(chunks_ready: bool = False, worker: UUID | None = None) -> Claim:
    """A claim as the claim statement makes it; ``chunks_ready`` says whether the job's chunk
    set is stored already (the job then only embeds)."""
    job_id = uuid.uuid4()
    return Claim(
        job_id=job_id,
        worker_id=worker or uuid.uuid4(),
        claim_token=uuid.uuid4(),
        document_version_id=uuid.uuid4(),
        embedding_model_id=uuid.uuid4(),
        attempt_id=uuid.uuid4(),
        attempt_no=1,
        lease_expires_at=datetime.now(UTC),
        document_key=f"handbook/{job_id.hex[:8]}.md",
        chunks_ready=chunks_ready,
    )


@attrs.define(eq=False)
class FakeQueue:
    """Jobs are their claims' ``chunks_ready``: False (the chunk set is not stored, the job
    parses first) or True (it only embeds)."""

    pending: list[bool] = attrs.field(factory=list)
    # jobs that become claimable at a (virtual) time: scheduled retries, as drain sees them
    later: list[tuple[float, bool]] = attrs.field(factory=list)
    # PROCESSING jobs of a dead worker: (lease expiry time, chunks_ready); recover() requeues them
    orphans: list[tuple[float, bool]] = attrs.field(factory=list)
    release_error: Exception | None = None
    release_behaviour: Callable[[Claim], Awaitable[None]] | None = None
    calls: list[tuple[float, str, object]] = attrs.field(factory=list)
    registered: trio.Event | None = None  # when set, registration waits for it
    renew_behaviour: Callable[[Claim, int], Awaitable[None]] | None = None
    fail_behaviour: Callable[[Claim], Awaitable[None]] | None = None
    claim_error: Exception | None = None
    complete_behaviour: Callable[[Claim], Awaitable[None]] | None = None
    complete_seconds: float = 0.0  # how long a completion takes to commit (virtual time)
    renewals: dict[UUID, int] = attrs.field(factory=dict)
    worker_id: UUID = attrs.field(factory=uuid.uuid4)

    def log(self, what: str, detail: object = None) -> None:
        self.calls.append((trio.current_time(), what, detail))

    def names(self) -> list[str]:
        return [name for _, name, _ in self.calls]

    def of(self, name: str) -> list[tuple[float, object]]:
        return [(t, d) for t, n, d in self.calls if n == name]

    async def register_worker(
        self, *, hostname: str, pid: int, version: str, max_concurrency: int, chunking: str
    ) -> UUID:
        if self.registered is not None:
            await self.registered.wait()
        self.log("register")
        return self.worker_id

    async def heartbeat(self, worker_id: UUID) -> bool:
        self.log("heartbeat")
        return True

    async def set_worker_status(self, worker_id: UUID, status: WorkerStatus) -> None:
        self.log(f"status:{status.value}")

    async def claim(self, worker_id: UUID, k: int, model_id: UUID | None = None) -> list[Claim]:
        await trio.lowlevel.checkpoint()
        if self.claim_error is not None:
            error, self.claim_error = self.claim_error, None
            self.log("claim-error", k)
            raise error
        now = trio.current_time()
        self.pending += [ready for at, ready in self.later if at <= now]
        self.later = [(at, ready) for at, ready in self.later if at > now]
        taken, self.pending = self.pending[:k], self.pending[k:]
        claims = [make_claim(ready, worker_id) for ready in taken]
        self.log("claim", (k, len(claims)))
        return claims

    async def renew_many(self, claims: Sequence[Claim]) -> list[datetime | Exception]:
        """One call for the group, as the real one; each claim's result as :meth:`renew` gives
        it (a refusal is that claim's result; any other error fails the whole call)."""
        self.log("renew-call", len(claims))
        results: list[datetime | Exception] = []
        for claim in claims:
            try:
                results.append(await self.renew(claim))
            except OwnershipLost as refused:
                results.append(refused)
        return results

    async def renew(self, claim: Claim) -> datetime:
        """One claim's renewal inside :meth:`renew_many` (its behaviour per call count)."""
        count = self.renewals.get(claim.job_id, 0) + 1
        self.renewals[claim.job_id] = count
        self.log("renew", claim.job_id)
        if self.renew_behaviour is not None:
            await self.renew_behaviour(claim, count)
        return datetime.now(UTC)

    async def complete(self, claim: Claim) -> CompleteResult:
        await trio.sleep(self.complete_seconds)
        if self.complete_behaviour is not None:
            await self.complete_behaviour(claim)
        self.log("complete", claim.job_id)
        return CompleteResult(became_current=True)

    async def fail(self, claim: Claim, failure_type: FailureType, message: str) -> FailResult:
        await trio.lowlevel.checkpoint()
        self.log("fail", (claim.job_id, failure_type, message))
        if self.fail_behaviour is not None:
            await self.fail_behaviour(claim)
        outcome = FailOutcome.RETRY_SCHEDULED if failure_type.retryable else FailOutcome.FAILED
        return FailResult(outcome=outcome, available_at=None)

    async def serve(self) -> None:
        await trio.sleep_forever()

    async def recover(self) -> list[RecoveredJob]:
        await trio.lowlevel.checkpoint()
        now = trio.current_time()
        expired = [ready for at, ready in self.orphans if at <= now]
        self.orphans = [(at, ready) for at, ready in self.orphans if at > now]
        self.pending += expired
        self.log("recover", len(expired))
        return [
            RecoveredJob(job_id=uuid.uuid4(), attempt_no=1, outcome=FailOutcome.RETRY_SCHEDULED)
            for _ in expired
        ]

    async def release(self, claim: Claim) -> None:
        await trio.lowlevel.checkpoint()
        self.log("release", claim.job_id)
        if self.release_behaviour is not None:
            await self.release_behaviour(claim)
        if self.release_error is not None:
            raise self.release_error

    async def drain_state(
        self, worker_id: UUID, model_id: UUID | None, heartbeat_timeout: float
    ) -> DrainState:
        await trio.lowlevel.checkpoint()
        now = trio.current_time()
        due = [at for at, _ in self.later + self.orphans]
        state = DrainState(
            scheduled=len(self.pending) + len(self.later),
            orphaned=len(self.orphans),
            expired_orphans=sum(1 for at, _ in self.orphans if at <= now),
            next_due_in=max(0.0, min(due) - now) if due else None,
        )
        self.log("drain-state", state)
        return state


async def refuse(*_: object) -> None:
    raise OwnershipLost("refused")


@attrs.define(eq=False)
class FakeSteps:
    """Each step sleeps ``duration`` (virtual time) then runs ``behaviour`` if given."""

    queue: FakeQueue
    duration: float = 1.0
    behaviour: dict[str, Callable[[Claim], Awaitable[None]]] = attrs.field(factory=dict)
    active: int = 0
    max_active: int = 0
    forgotten: list[UUID] = attrs.field(factory=list)

    async def _step(self, name: str, claim: Claim) -> int:
        self.queue.log(name, claim.job_id)
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            await trio.sleep(self.duration)
            if name in self.behaviour:
                await self.behaviour[name](claim)
        finally:
            self.active -= 1
        return 1

    async def parse(self, claim: Claim) -> int:
        return await self._step("parse", claim)

    async def embed(self, claim: Claim) -> int:
        return await self._step("embed", claim)

    async def complete(self, claim: Claim) -> CompleteResult:
        return await self.queue.complete(claim)

    def forget(self, claim: Claim) -> None:
        self.forgotten.append(claim.job_id)

    async def serve(self) -> None:
        await trio.sleep_forever()
