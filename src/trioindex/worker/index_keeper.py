"""The worker's watch over its model's vector index: built once the model has enough vectors.

A model is searched exactly until it has ``embedding.index-min-vectors`` vectors
(:mod:`trioindex.db.vector_index` says why and what is indexed). The check at worker start
also replaces the float32 HNSW index an older release built, and a bit graph built with other
parameters than today's (the new index is built beside it, then the old one dropped). The
keeper checks at worker start, then again after every ``check_every`` vectors this worker
stores, and builds the index concurrently (other workers keep committing) when the count is
reached. Once a valid index exists it stops checking.
A first build that is due while a job of the model is under way or due waits for the load to
end (:func:`~trioindex.db.vector_index.build_deferred`: a bulk load is indexed in one build over
all its rows instead of partly row by row, up to three times the threshold); while it waits the
keeper also checks every :data:`DEFERRED_RECHECK` seconds, so the index comes soon after the
load ends even if this worker stores nothing more.
A draining worker checks once more at the end (:meth:`VectorIndexKeeper.check`, after waiting
for a build under way), so a bulk load run with ``worker --drain`` ends with its index built
or, on a PostgreSQL of its own (not the embedded one, which stops with its last user), with
its first build handed to the server: sent, and left to PostgreSQL to finish after the worker
exits (:func:`~trioindex.db.vector_index.send_first_build`; search ranks exactly until then).

The build runs on a connection of its own, in a thread, with PostgreSQL's parallel workers
for index builds (``max_parallel_maintenance_workers``) whatever the table's size; on
cancellation the server is asked to cancel the statement and the keeper waits (a few seconds
at most) for the thread to let its connection and lock go: stopping a worker never waits for
a build that can take minutes. An interrupted build is dropped and started again at the next
check.
"""

from __future__ import annotations

import enum
import functools
import logging
import math
import threading

import attrs
import psycopg
import trio

from trioindex.db.models import EmbeddingModel
from trioindex.db.pool import Connection, connect
from trioindex.db.vector_index import (
    IndexState,
    build_deferred,
    build_vector_index,
    index_state,
    send_first_build,
)
from trioindex.errors import DatabaseUnavailable

logger = logging.getLogger(__name__)

# How often a keeper whose build waits for a load to end looks again without being woken.
DEFERRED_RECHECK = 30.0


def _check_every(keeper: VectorIndexKeeper) -> int:
    # A fifth of the threshold: the index comes at most 20 % late. The count reads at most
    # min_vectors of the model's rows (about five per stored vector), but it also scans past
    # other models' rows (a model switch over a large table: 1M of them cost ~500 row reads,
    # some tens of microseconds, per stored vector until the index exists).
    return max(100, keeper.min_vectors // 5)


class _Checked(enum.Enum):
    """What one check did."""

    NOTHING = "nothing"  # not due, already valid, or another session is building it
    DEFERRED = "deferred"  # due, but waiting for the model's load to end
    SENT = "sent"  # a first build handed to PostgreSQL to finish
    BUILT = "built"  # a build (or rebuild) ran to its end here


@attrs.define(eq=False)
class VectorIndexKeeper:
    """Watches one model's vector count for one worker; see the module docstring."""

    conninfo: str
    model: EmbeddingModel
    min_vectors: int
    check_every: int = attrs.field(default=attrs.Factory(_check_every, takes_self=True))
    indexed: bool = False  # a valid index exists: no more checks
    built: int = 0  # builds this keeper ran (for tests and logs)
    sent: int = 0  # first builds this keeper handed to PostgreSQL (check(hand_off=True))
    deferred: bool = False  # the last check found the build due but waiting for a backlog
    _since_check: int = 0
    _wake: trio.Event = attrs.field(factory=trio.Event)
    _one_at_a_time: trio.Lock = attrs.field(factory=trio.Lock)

    def note_stored(self, vectors: int) -> None:
        """``vectors`` of the model were committed; wakes the keeper every ``check_every``."""
        if self.indexed:
            return
        self._since_check += vectors
        if self._since_check >= self.check_every:
            self._wake.set()

    async def serve(self) -> None:
        """Check now, then at each wake-up, until the index is valid (or cancelled)."""
        while not await self.check():
            with trio.move_on_after(DEFERRED_RECHECK if self.deferred else math.inf):
                await self._wake.wait()

    async def check(self, *, hand_off: bool = False) -> bool:
        """Build the index if it is due; True once a valid index exists. A check already under
        way (a build) is waited for first. With ``hand_off`` a first build is sent and left to
        PostgreSQL to finish (:func:`~trioindex.db.vector_index.send_first_build`; False is
        returned: the index is not valid yet); any other build runs to its end."""
        async with self._one_at_a_time:
            return await self._check(hand_off)

    async def _check(self, hand_off: bool) -> bool:
        if self.indexed:
            return True
        self._since_check = 0
        self._wake = trio.Event()
        sessions: list[Connection] = []
        finished = threading.Event()

        def build() -> tuple[_Checked, bool]:
            """What this check did, and whether the index is valid now."""
            try:
                with connect(self.conninfo) as conn:
                    sessions.append(conn)
                    if build_deferred(conn, self.model, min_vectors=self.min_vectors):
                        return _Checked.DEFERRED, False
                    if hand_off and send_first_build(
                        conn, self.model, min_vectors=self.min_vectors
                    ):
                        conn.close()  # no other statement: the server finishes the build
                        return _Checked.SENT, False
                    built = build_vector_index(conn, self.model, min_vectors=self.min_vectors)
                    valid = index_state(conn, self.model) is IndexState.VALID
                    return (_Checked.BUILT if built else _Checked.NOTHING), valid
            finally:
                finished.set()

        try:
            checked, valid = await trio.to_thread.run_sync(build, abandon_on_cancel=True)
        except trio.Cancelled:
            with trio.CancelScope(shield=True):
                for conn in (c for c in sessions if not c.closed):  # closed: sent, or done
                    cancel = functools.partial(conn.cancel_safe, timeout=2.0)
                    await trio.to_thread.run_sync(cancel)
                await trio.to_thread.run_sync(finished.wait, 5.0)
            raise
        except (psycopg.Error, DatabaseUnavailable) as exc:
            logger.warning(
                "model %s: cannot check its HNSW index (%s); trying again later",
                self.model.name,
                type(exc).__name__,
            )
            return False
        deferred = checked is _Checked.DEFERRED
        if deferred and not self.deferred:
            logger.info("model %s: HNSW index due, built once its load ends", self.model.name)
        self.deferred = deferred
        if checked is _Checked.SENT:
            self.sent += 1
            logger.info(
                "model %s: HNSW index build handed to PostgreSQL (search is exact until it ends)",
                self.model.name,
            )
        elif checked is _Checked.BUILT:
            self.built += 1
            logger.info("model %s: HNSW index built", self.model.name)
        self.indexed = valid
        return valid
