"""pgvector's adapters for a pool's connections, its types read from the catalog once.

pgvector's ``register_vector`` reads its four types (``vector``, ``bit``, ``halfvec``,
``sparsevec``) from the catalog on every connection it is given. A pool calls its ``configure``
on every connection it opens, and a worker's pool opens several each time a backlog grows it,
so :class:`PgvectorTypes` reads them once and registers the same types on every later
connection (``bench/pool_connect.py`` measures both).
"""

from __future__ import annotations

from typing import Any

import psycopg
from pgvector.psycopg import register_vector

# what register_vector calls with each type it looked up (pgvector exports only the former)
from pgvector.psycopg.bit import register_bit_info
from pgvector.psycopg.halfvec import register_halfvec_info
from pgvector.psycopg.sparsevec import register_sparsevec_info
from pgvector.psycopg.vector import register_vector_info
from psycopg.types import TypeInfo


class PgvectorTypes:
    """A pool's ``configure``: pgvector's types looked up on the first connection that finds
    the extension, and the same registered on every later one. A pool serves one database, and
    its tables' columns depend on the extension, so its types cannot change under it.
    """

    def __init__(self) -> None:
        self._infos: tuple[TypeInfo, TypeInfo, TypeInfo | None, TypeInfo | None] | None = None

    def __call__(self, conn: psycopg.Connection[Any]) -> None:
        infos = self._infos
        if infos is None:
            vector = TypeInfo.fetch(conn, "vector")
            if vector is None:  # no extension yet: register_vector says so
                register_vector(conn)
                return
            bit = TypeInfo.fetch(conn, "bit")  # built in: found wherever vector is
            assert bit is not None
            infos = vector, bit, TypeInfo.fetch(conn, "halfvec"), TypeInfo.fetch(conn, "sparsevec")
            # several pool threads may get here at once: each stores the same types
            self._infos = infos
        vector, bit, halfvec, sparsevec = infos
        register_vector_info(conn, vector)
        register_bit_info(conn, bit)
        if halfvec is not None:
            register_halfvec_info(conn, halfvec)
        if sparsevec is not None:
            register_sparsevec_info(conn, sparsevec)
