"""Python's cyclic garbage collector, tuned for a worker's long run.

A worker allocates a few hundred container objects per small document (its task, cancel scopes,
rows, the statement's parameters) and keeps several hundred jobs in flight, so with CPython's
default first threshold (700 allocations) collections come every few jobs, and the survivors
they promote (jobs still in flight) make the older generations' collections, which walk every
object tracked since start-up, come often too: 12 % of a worker's CPU over 3,000 small
documents (docs/test-results/peer.md, "Where a 20,000-document run's wall time goes").
:func:`settle` is called once the worker's modules, settings and services are loaded: what
exists then lives as long as the process, so it is moved out of the collector's view
(``gc.freeze``), and the first threshold is raised so most of a job's objects are freed by
their reference counts before a collection looks at them. Cycles are still collected (trio's
tasks and tracebacks make some), only less often: the youngest generation holds at most
:data:`YOUNG_THRESHOLD` more objects between collections.
"""

from __future__ import annotations

import gc

# Allocations of container objects between two collections of the youngest generation
# (CPython's default: 700). Over 3,000 small documents the collector's CPU fell from 0.43 s
# to 0.18 s with this threshold, and to 0.11 s with the start-up objects frozen as well.
YOUNG_THRESHOLD = 10_000


def settle() -> None:
    """Freeze the objects alive now (the process's modules and services) and raise the
    youngest generation's threshold to :data:`YOUNG_THRESHOLD`; the older generations keep
    their thresholds."""
    gc.collect()  # what start-up left as garbage is freed, not frozen
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
