"""The worker's garbage collector settings (worker/collector.py), in a process of their own so
the test process keeps CPython's defaults."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import gc, weakref
from trioindex.worker import collector
young, older, oldest = gc.get_threshold()
class Node: pass
garbage = Node()
garbage.me = garbage  # a cycle, unreachable once the name is gone
freed = weakref.ref(garbage)
del garbage
kept = [object() for _ in range(10)]
collector.settle()
print(young, older, oldest, *gc.get_threshold(), gc.get_freeze_count() > 0,
      any(o is kept for o in gc.get_objects()), freed() is None)
"""


def test_settle_freezes_what_is_alive_and_raises_only_the_youngest_threshold() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
    ).stdout.split()
    before, after = out[:3], out[3:6]
    assert after == [str(10_000), before[1], before[2]]
    # frozen: start-up's objects (the list kept here among them) are out of the collector's
    # view; start-up's garbage (the cycle) was freed first, not frozen with them
    assert out[6:] == ["True", "False", "True"]
