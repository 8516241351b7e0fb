"""What one :meth:`~trioindex.worker.runtime.Worker.serve` call owns (:class:`ServeRun`) and the
place each of its jobs holds (:class:`JobPlace`): a slot while the job runs its steps, then a
finishing place while its completion is written. The poller's rule for when a freed place
means "claim again" is :meth:`ServeRun.slot_freed` (the runtime's module docstring says why).
"""

from __future__ import annotations

import math
from uuid import UUID

import attrs
import trio

from trioindex.worker.job import JobContext, JobRunner


@attrs.define(eq=False)
class JobPlace:
    """The place one job holds, by its token: a slot while it runs its steps, then a finishing
    place while its completion is written."""

    limiter: trio.CapacityLimiter
    token: object

    async def move_to(self, other: trio.CapacityLimiter) -> None:
        """Take a place in ``other`` (waiting for one), then give this one back. Cancelled
        while waiting, the job keeps the place it had."""
        await other.acquire_on_behalf_of(self.token)
        self.limiter.release_on_behalf_of(self.token)
        self.limiter = other

    def release(self) -> None:
        self.limiter.release_on_behalf_of(self.token)


@attrs.define(eq=False)
class ServeRun:
    """What one :meth:`Worker.serve` call owns, from registration to STOPPED."""

    worker_id: UUID
    # serve(drain=True): the run ends once the queue is drained
    drain: bool
    slots: trio.CapacityLimiter
    # jobs whose completion is being written hold one of these instead of a slot
    finishing: trio.CapacityLimiter
    jobs: JobRunner
    intake: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    running: set[JobContext] = attrs.field(factory=set)
    wakeup: trio.Event = attrs.field(factory=trio.Event)
    # the last claim returned fewer jobs than it asked for (none included): a freed slot is no
    # reason to claim again (the runtime's module docstring)
    queue_empty: bool = False
    # woken by a NOTIFY or recovered leases since the current claim began
    notified: bool = False
    # the LISTEN connection is up (NOTIFYs arrive); it was lost at least once this run
    listening: bool = False
    listen_lost: bool = False
    drain_logged_at: float = -math.inf

    def wake(self) -> None:
        """Jobs may be claimable (a NOTIFY, recovered leases): the poller claims at once."""
        self.notified = True
        self.wakeup.set()

    def set_listening(self, live: bool) -> None:
        """The LISTEN connection is in place (True) or lost (False). The poller claims at once
        when it is lost, or back after a loss (NOTIFYs may have been missed meanwhile)."""
        if self.listening == live:
            return
        self.listening = live
        if not live or self.listen_lost:
            self.wake()
        self.listen_lost = self.listen_lost or not live

    def slot_freed(self) -> None:
        """A job left its slot or its finishing place: the poller claims at once, unless its
        last claim found no other row to take — then only the last job to end in a drain wakes
        it, so the drain is checked at once."""
        if not self.queue_empty or (self.drain and not self.running):
            self.wakeup.set()
