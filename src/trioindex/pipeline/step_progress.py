"""Progress lines of a long step: how much of a document's work is done, every few seconds.

An embed step of a large document sends its chunks in many batches and can run for minutes;
:class:`StepProgress` counts the chunks whose vectors arrived and logs
``job 1b2c…: 1200 of 5000 chunks embedded (30 s)`` (the full job id) at most once per
:data:`EVERY` seconds, when a batch arrives. A step that ends sooner logs nothing. A line
never holds chunk text or a vector: the job's id, counts and seconds only.
"""

from __future__ import annotations

import logging
from typing import Final
from uuid import UUID

import attrs
import trio

logger = logging.getLogger(__name__)

#: Seconds between two progress lines of one step.
EVERY: Final = 15.0


@attrs.define
class StepProgress:
    """Counts the chunks of one job's embed step (:meth:`add`) and logs its progress."""

    job_id: UUID
    total: int
    every: float = EVERY
    done: int = 0
    started: float = attrs.field(factory=trio.current_time)
    last_line: float = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.last_line = self.started

    def add(self, count: int) -> None:
        """``count`` more chunks have their vectors; log a line when ``every`` seconds have
        passed since the last one (or the start) and the step is not done."""
        self.done += count
        now = trio.current_time()
        if self.done < self.total and now - self.last_line >= self.every:
            self.last_line = now
            logger.info(
                "job %s: %d of %d chunks embedded (%.0f s)",
                self.job_id,
                self.done,
                self.total,
                now - self.started,
            )
