"""The job state machine on PostgreSQL: worker rows, claim, renew, complete, fail, release,
recover, operator retry and the drain count — every write of ``embedding_jobs.status`` (and of
the attempts' status) from Python is one function here; the fenced ones are SQL functions of
``functions.sql`` that these call (docs/design/state-machine.md lists every transition).

Every public function takes a connection in autocommit mode and runs exactly one short
transaction: a ``with conn.transaction()`` block, or a single statement, which autocommit makes
its own transaction without the extra BEGIN/COMMIT round trips (see docs/design/architecture.md).
:class:`trioindex.worker.queue.JobQueue` is the async facade that runs them in threads. Lock order
is always job row, then version row, then document row. A job is the state of one (version,
model) pair: failing, retrying or recovering it never touches another model's job or what
another model serves. Events are written through :mod:`trioindex.db.events`.

Every write after the claim — renew included — goes through the fence
(:mod:`trioindex.db.fence`): a claim that no longer owns its job gets
:class:`~trioindex.errors.OwnershipLost` (raised by a one-job function, returned in its own
result by a group function: the group renewal, the grouped completion) and nothing is written
for it.

The modules, one owner each: :mod:`.workers` (worker rows), :mod:`.claim` (claim and lease
renewal), :mod:`.finish` (completion, failure report, hand-back), :mod:`.recovery` (lease
recovery and the drain count) and :mod:`.retry` (the operator's retry). Callers import the
functions from this package.
"""

from __future__ import annotations

from trioindex.db.fence import lock_owned_job
from trioindex.db.jobs.claim import claim_jobs, renew_leases
from trioindex.db.jobs.finish import complete_job, complete_many, fail_job, release_job
from trioindex.db.jobs.recovery import drain_state, recover_expired
from trioindex.db.jobs.retry import retry_failed
from trioindex.db.jobs.workers import heartbeat, register_worker, set_worker_status

__all__ = [
    "claim_jobs",
    "complete_job",
    "complete_many",
    "drain_state",
    "fail_job",
    "heartbeat",
    "lock_owned_job",
    "recover_expired",
    "register_worker",
    "release_job",
    "renew_leases",
    "retry_failed",
    "set_worker_status",
]
