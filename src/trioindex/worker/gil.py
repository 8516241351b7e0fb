"""The interpreter lock's switch interval, shortened for a worker's long run.

A worker's Trio thread does its Python work (parsing, the embedding client, the job tasks)
without pause while jobs are in flight, and its database calls run in threads
(:meth:`trioindex.db.pool.Database.run`). Each time such a thread comes back from PostgreSQL it
needs the interpreter lock for its next few Python lines, and CPython makes a busy thread hand
the lock over only after the switch interval (5 ms by default). A claim or a group commit comes
back several times (the statement, its rows, the commit), so under a busy Trio thread it waited
tens of milliseconds for the lock while PostgreSQL had long answered; claims are one at a time,
so that wait bounded a lone worker's rate (docs/test-results/fleet.md, run 14).
:func:`shorten` sets :data:`SWITCH_INTERVAL`: the database threads get the lock back within a
fraction of a millisecond, and the Trio thread gives it up only when one of them asks.
"""

from __future__ import annotations

import sys

#: Seconds a thread may keep the interpreter lock while another waits for it (CPython: 0.005).
SWITCH_INTERVAL = 0.0005


def shorten() -> None:
    """Set the process's switch interval to :data:`SWITCH_INTERVAL`."""
    sys.setswitchinterval(SWITCH_INTERVAL)
