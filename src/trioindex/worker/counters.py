"""Worker counters kept in one place: the runtime increments them, metrics and logs read them.

Plain integers mutated from the Trio thread only, so they need no lock.
"""

from __future__ import annotations

import attrs


@attrs.define
class WorkerCounters:
    claimed: int = 0
    succeeded: int = 0
    failed: int = 0  # ended FAILED (non-retryable or attempts spent)
    retried: int = 0  # failed, retry scheduled
    lost: int = 0  # ownership lost mid-job: no further writes, recovery owns it
    report_refused: int = 0  # a fail report refused or impossible: left to lease recovery
    cancelled: int = 0  # cancelled at shutdown: left to lease recovery
    renewals: int = 0
    renewal_errors: int = 0
    recovered: int = 0  # expired leases this worker's recovery loop returned to the queue
    polls: int = 0
    empty_polls: int = 0

    def snapshot(self) -> dict[str, int]:
        return attrs.asdict(self)
