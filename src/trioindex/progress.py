"""``ingest --wait``: poll the jobs an ingest created and show how far they are.

On a terminal a live progress bar is drawn; otherwise (a pipe, a log file, CI) one plain line
every :data:`LINE_SECONDS` of Trio's clock and one at the end, so a long wait is never silent::

    indexing: 12/355 documents done, 3 failed, 420 chunks embedded (1m05s)
"""

from __future__ import annotations

import sys
from datetime import UTC
from typing import Any, TextIO
from uuid import UUID

import attrs
import trio

from trioindex.db.operations.wait_progress import abandoned_leases, jobs_progress
from trioindex.db.operations.workers import live_worker_count
from trioindex.db.pool import Database

POLL_SECONDS = 0.5
WORKER_CHECK_POLLS = 10  # look for a live worker every 5 s
LINE_SECONDS = 5.0  # without a terminal: a progress line this often

NO_WORKER_HINT = (
    "no live worker is registered (none RUNNING with a heartbeat in the last {timeout:.0f}s), "
    "so nothing will index these jobs: start one with `trioindex worker` (`just worker` in the "
    "project) in another terminal; still waiting"
)
LEASE_WAIT = (
    "waiting for the lease on {key}: its worker {worker} stopped without handing the job back;"
    " the lease runs until {until:%H:%M:%S} UTC (in {left}), then a live worker takes it over"
)
LEASE_OVER = (
    "waiting for {key}: its worker {worker} stopped without handing the job back; its lease ran"
    " out at {until:%H:%M:%S} UTC, and the next live worker's recovery check takes it over"
)


@attrs.frozen
class WaitResult:
    """How a wait ended: the final rows of the jobs that still exist, and the ids of the jobs
    that were removed meanwhile (their document deleted, or their model removed)."""

    finals: tuple[dict[str, Any], ...]
    removed: frozenset[UUID]


@attrs.frozen
class Tally:
    """Where the waited-for jobs are: ended (done, removed jobs included) of total."""

    done: int
    total: int
    failed: int
    chunks: int


async def wait_for_jobs(
    db: Database,
    job_ids: list[UUID],
    *,
    show: bool = True,
    heartbeat_timeout: float | None = None,
    out: TextIO | None = None,
) -> WaitResult:
    """Wait until every job is SUCCEEDED, FAILED or gone (a removed job never finishes).

    With ``show``, progress goes to ``out`` (default stdout): a live bar on a terminal, plain
    lines otherwise. With ``heartbeat_timeout``, says once (on stderr) when no live worker is
    registered, since then the wait would otherwise sit at 0 done with no explanation, and once
    per lease when a job is held by a worker that is not live: whose lease it waits for, and
    until when.
    """
    if not job_ids:
        return WaitResult((), frozenset())
    stream = sys.stdout if out is None else out
    display = (_Bar(stream) if stream.isatty() else _Lines(stream)) if show else None
    polls, hinted = 0, False
    leases_said: set[tuple[UUID, Any, bool]] = set()  # job, lease end, whether it ran out
    try:
        while True:
            rows = await db.run(jobs_progress, job_ids)
            done = [r for r in rows if r["status"] in ("SUCCEEDED", "FAILED")]
            tally = Tally(
                done=len(done) + len(job_ids) - len(rows),
                total=len(job_ids),
                failed=sum(1 for r in rows if r["status"] == "FAILED"),
                chunks=sum(r["embedded"] for r in rows),
            )
            finished = len(done) == len(rows)
            if display is not None:
                display.update(tally, final=finished)
            if finished:
                removed = frozenset(job_ids) - {r["id"] for r in rows}
                return WaitResult(tuple(rows), removed)
            if heartbeat_timeout is not None and polls % WORKER_CHECK_POLLS == 0:
                if not hinted:
                    hinted = await db.run(live_worker_count, heartbeat_timeout) == 0
                    if hinted:  # stderr: the live bar redraws below it
                        print(NO_WORKER_HINT.format(timeout=heartbeat_timeout), file=sys.stderr)
                for lease in await db.run(abandoned_leases, job_ids, heartbeat_timeout):
                    said = (lease["id"], lease["lease_expires_at"], lease["seconds_left"] <= 0)
                    if said not in leases_said:
                        leases_said.add(said)
                        print(_lease_note(lease), file=sys.stderr)
            polls += 1
            await trio.sleep(POLL_SECONDS)
    finally:
        if display is not None:
            display.close()


def _lease_note(lease: dict[str, Any]) -> str:
    left = float(lease["seconds_left"])
    text = LEASE_WAIT if left > 0 else LEASE_OVER
    return text.format(
        key=lease["external_key"],
        worker=str(lease["worker_id"])[:8],
        until=lease["lease_expires_at"].astimezone(UTC),
        left=_elapsed(left),
    )


class _Lines:
    """Plain progress lines: the first at once, then one every :data:`LINE_SECONDS`, and the
    last when the wait ends."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.began = trio.current_time()
        self.next_at = self.began

    def update(self, tally: Tally, *, final: bool) -> None:
        now = trio.current_time()
        if not final and now < self.next_at:
            return
        self.next_at = now + LINE_SECONDS
        failed = f", {tally.failed} failed" if tally.failed else ""
        print(
            f"indexing: {tally.done}/{tally.total} documents done{failed},"
            f" {tally.chunks} chunks embedded ({_elapsed(now - self.began)})",
            file=self.out,
            flush=True,
        )

    def close(self) -> None:
        pass


class _Bar:
    """The live bar (rich), for a terminal."""

    def __init__(self, out: TextIO) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(
            TextColumn("[bold]indexing"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(
                "documents · {task.fields[chunks]} chunks embedded · {task.fields[failed]} failed"
            ),
            TimeElapsedColumn(),
            console=Console(file=out),
            transient=False,
        )
        self.progress.start()
        self.task = self.progress.add_task("jobs", total=None, chunks=0, failed=0)

    def update(self, tally: Tally, *, final: bool) -> None:
        self.progress.update(
            self.task,
            total=tally.total,
            completed=tally.done,
            chunks=tally.chunks,
            failed=tally.failed,
        )

    def close(self) -> None:
        self.progress.stop()


def _elapsed(seconds: float) -> str:
    """``42s``, ``1m05s``, ``2h03m``."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02}m"
