"""``ingest --wait``: poll the jobs an ingest created and draw a live progress bar."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import trio
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trioindex.admin import jobs_progress
from trioindex.db.pool import Database

POLL_SECONDS = 0.5


async def wait_for_jobs(
    db: Database, job_ids: list[UUID], *, show: bool = True
) -> list[dict[str, Any]]:
    """Wait until every job is SUCCEEDED or FAILED; return their final rows."""
    if not job_ids:
        return []
    columns = (
        TextColumn("[bold]indexing"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(
            "documents · {task.fields[chunks]} chunks embedded · {task.fields[failed]} failed"
        ),
        TimeElapsedColumn(),
    )
    with Progress(*columns, disable=not show, transient=False) as bar:
        task = bar.add_task("jobs", total=len(job_ids), chunks=0, failed=0)
        while True:
            rows = await db.run(jobs_progress, job_ids)
            done = [r for r in rows if r["status"] in ("SUCCEEDED", "FAILED")]
            bar.update(
                task,
                completed=len(done),
                chunks=sum(r["embedded"] for r in rows),
                failed=sum(1 for r in rows if r["status"] == "FAILED"),
            )
            if len(done) == len(job_ids):
                return rows
            await trio.sleep(POLL_SECONDS)
