"""The worker runtime's own cost, without a database: CPU per no-op job, and renewal calls.

``python -m bench.worker_runtime [--baseline-tree DIR]``. Two figures of
:class:`trioindex.worker.runtime.Worker` over an in-memory queue (no PostgreSQL, no threads):

* **no-op jobs**: ``--jobs`` claims of jobs whose steps return at once, drained at
  concurrency 8 on the real clock; the process CPU per job is what the runtime itself costs a
  job (slots, the job's task and scopes, renewal bookkeeping, metrics, the outcome line);
* **held leases**: ``--held`` jobs whose steps last ten renewal intervals, on Trio's virtual
  clock: how many renewal calls the worker makes per interval (one database statement and one
  thread hand-off each, in the real queue) and how many leases they renew.

With ``--baseline-tree DIR`` (another checkout, e.g. ``git worktree add --detach /tmp/base
main``) every round also runs that tree's ``trioindex`` in a fresh interpreter, alternating
with this one, and the ratios are printed. Prints the machine and the load; writes nothing.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import statistics
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import attrs
import trio
import trio.testing

from bench.common import (
    add_tree_options,
    compared_trees,
    format_machine,
    machine_info,
    run_child_in_tree,
)
from trioindex.config import default_settings
from trioindex.values import Claim, CompleteResult, DrainState, FailResult, RecoveredJob

CONCURRENCY = 8
RENEWAL_INTERVAL = 60.0


def _claim(job: int) -> Claim:
    job_id = uuid.UUID(int=job + 1)
    return Claim(
        job_id=job_id,
        worker_id=job_id,
        claim_token=job_id,
        document_version_id=job_id,
        embedding_model_id=job_id,
        attempt_id=job_id,
        attempt_no=1,
        lease_expires_at=datetime.now(UTC),
        document_key=f"bench/{job}",
        chunks_ready=True,
    )


@attrs.define(eq=False)
class MemoryQueue:
    """Claims from a list; every write succeeds at once. Renewal calls are counted, through
    whichever method the runtime under test calls (one claim, or a group)."""

    claims: list[Claim]
    renew_calls: int = 0
    leases_renewed: int = 0

    async def register_worker(self, **_: Any) -> uuid.UUID:
        return uuid.uuid4()

    async def heartbeat(self, worker_id: uuid.UUID) -> bool:
        return True

    async def set_worker_status(self, worker_id: uuid.UUID, status: Any) -> None:
        return None

    async def claim(self, worker_id: uuid.UUID, k: int, model_id: Any = None) -> list[Claim]:
        await trio.lowlevel.checkpoint()
        taken, self.claims = self.claims[:k], self.claims[k:]
        return taken

    async def recover(self) -> list[RecoveredJob]:
        return []

    async def drain_state(
        self, worker_id: uuid.UUID, model_id: Any, heartbeat_timeout: float
    ) -> DrainState:
        return DrainState(scheduled=0, orphaned=0, expired_orphans=0, next_due_in=None)

    async def serve(self) -> None:
        await trio.sleep_forever()

    async def renew(self, claim: Claim) -> datetime:
        await trio.lowlevel.checkpoint()
        self.renew_calls += 1
        self.leases_renewed += 1
        return datetime.now(UTC)

    async def renew_many(self, claims: Sequence[Claim]) -> list[datetime | Exception]:
        await trio.lowlevel.checkpoint()
        self.renew_calls += 1
        self.leases_renewed += len(claims)
        return [datetime.now(UTC)] * len(claims)

    async def complete(self, claim: Claim) -> CompleteResult:
        await trio.lowlevel.checkpoint()
        return CompleteResult(became_current=True)

    async def fail(self, claim: Claim, failure_type: Any, message: str) -> FailResult:
        raise AssertionError("no job fails here")

    async def release(self, claim: Claim) -> None:
        raise AssertionError("no job is handed back here")


@attrs.define(eq=False)
class SleepySteps:
    """Steps that last ``seconds`` (0: return at once) and complete through the queue."""

    queue: MemoryQueue
    seconds: float = 0.0

    async def parse(self, claim: Claim) -> int:
        return 0

    async def embed(self, claim: Claim) -> int:
        if self.seconds:
            await trio.sleep(self.seconds)
        return 1

    async def complete(self, claim: Claim) -> CompleteResult:
        return await self.queue.complete(claim)

    def forget(self, claim: Claim) -> None:
        return None

    async def serve(self) -> None:
        await trio.sleep_forever()


def _worker(queue: MemoryQueue, steps: SleepySteps, concurrency: int) -> Any:
    from trioindex.worker.runtime import Worker

    settings = attrs.evolve(
        default_settings().worker,
        max_concurrency=concurrency,
        polling_interval=1.0,
        lease_duration=5 * RENEWAL_INTERVAL,
        lease_renewal_interval=RENEWAL_INTERVAL,
    )
    return Worker(queue=queue, steps=steps, settings=settings)


def noop_jobs(jobs: int) -> dict[str, float]:
    queue = MemoryQueue([_claim(i) for i in range(jobs)])
    worker = _worker(queue, SleepySteps(queue), CONCURRENCY)
    began, cpu = time.perf_counter(), time.process_time()
    trio.run(functools.partial(worker.serve, drain=True))
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    assert worker.counters.succeeded == jobs, worker.counters.snapshot()
    return {"jobs_per_s": jobs / wall, "cpu_us_per_job": cpu / jobs * 1e6}


def held_leases(held: int) -> dict[str, float]:
    queue = MemoryQueue([_claim(i) for i in range(held)])
    worker = _worker(queue, SleepySteps(queue, seconds=10 * RENEWAL_INTERVAL), held)
    trio.run(
        functools.partial(worker.serve, drain=True),
        clock=trio.testing.MockClock(autojump_threshold=0),
    )
    intervals = 10.0
    return {
        "renew_calls_per_interval": queue.renew_calls / intervals,
        "leases_renewed_per_interval": queue.leases_renewed / intervals,
    }


def measure(jobs: int, held: int) -> dict[str, float]:
    return {**noop_jobs(jobs), **held_leases(held)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.worker_runtime", description=__doc__)
    parser.add_argument("--jobs", type=int, default=20_000, help="no-op jobs per round")
    parser.add_argument("--held", type=int, default=64, help="jobs holding a lease")
    add_tree_options(parser, rounds=3)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.child:
        print(json.dumps(measure(args.jobs, args.held)))
        return 0
    for line in format_machine(machine_info()):
        print(line)
    trees = compared_trees(args)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    for n in range(args.rounds):
        load = os.getloadavg()[0]
        for name, tree in trees if n % 2 == 0 else reversed(trees):
            out = run_child_in_tree(
                "bench.worker_runtime", tree, f"--jobs={args.jobs}", f"--held={args.held}"
            )
            result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
            runs[name].append(result)
            print(
                f"round {n + 1} {name:9} load {load:5.1f}: {result['jobs_per_s']:8,.0f} jobs/s,"
                f" {result['cpu_us_per_job']:6.1f} us CPU/job; {args.held} held leases:"
                f" {result['renew_calls_per_interval']:5.1f} renewal calls and"
                f" {result['leases_renewed_per_interval']:5.1f} leases renewed per interval"
            )
    if len(trees) > 1:
        for key in ("cpu_us_per_job", "renew_calls_per_interval"):
            this = statistics.median(r[key] for r in runs["this tree"])
            base = statistics.median(r[key] for r in runs["baseline"])
            print(f"{key}: median {this:.1f} against {base:.1f} (x{this / base:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
