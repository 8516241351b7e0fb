"""What one new pooled connection costs: pgvector's types looked up on each, or once a pool.

A pool opens connections while work grows it (a worker's pool goes from one to
``database.pool-size`` when a backlog is released, and back after ``database.pool-max-idle``);
every connection it opens runs the pool's ``configure``. This opens ``--connections``
connections, direct to PostgreSQL and through PgBouncer (transaction mode, as a fleet runs),
configured three ways, interleaved over ``--rounds`` rounds:

* ``none``: libpq's connection and one ``SELECT 1``, nothing registered (the floor);
* ``register_vector``: pgvector's own, which reads its four types from the catalog each time;
* ``PgvectorTypes``: trioindex's (``trioindex.db.pool``), which reads them on the first
  connection only; the figure is for the later ones.

Each figure is per connection: this process's CPU (``time.thread_time``), PostgreSQL's (its
server processes, reaped children included) and the wall time. Run
``.venv/bin/python -m bench.pool_connect``; it prints the machine and a table, and writes
nothing.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import psycopg
from pgvector.psycopg import register_vector
from psycopg.rows import dict_row

from bench.common import BenchPostgres, format_machine, machine_info
from bench.fleet import server_cpu_now
from testkit.pgbouncer import running_pgbouncer
from trioindex.db.pgvector_types import PgvectorTypes

Configure = Callable[[psycopg.Connection[Any]], None] | None


def measure(pg: BenchPostgres, url: str, configure: Configure, n: int) -> tuple[float, ...]:
    """ms per connection: this process's CPU, PostgreSQL's CPU, wall."""
    cpu, server, wall = time.thread_time(), server_cpu_now(pg), time.monotonic()
    for _ in range(n):
        with psycopg.connect(
            url, autocommit=True, row_factory=dict_row, prepare_threshold=None
        ) as conn:
            if configure is not None:
                configure(conn)
            conn.execute("SELECT 1")
    return (
        (time.thread_time() - cpu) * 1000 / n,
        (server_cpu_now(pg) - server) * 1000 / n,
        (time.monotonic() - wall) * 1000 / n,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--connections", type=int, default=300, help="per way and round (300)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    args = parser.parse_args()
    with BenchPostgres() as pg, pg.fresh_database("pool_connect") as url:
        print("\n".join(format_machine(machine_info(url))), flush=True)
        with running_pgbouncer(url) as bouncer:
            print(
                "\n| route | configure | round | client CPU ms | PostgreSQL CPU ms | wall ms |"
                "\n|---|---|---:|---:|---:|---:|",
                flush=True,
            )
            for round_no in range(1, args.rounds + 1):
                for route, target in (("direct", url), ("PgBouncer", bouncer)):
                    cached = PgvectorTypes()
                    cached(psycopg.connect(target, autocommit=True))  # its first connection
                    ways: list[tuple[str, Configure]] = [
                        ("none", None),
                        ("register_vector", register_vector),
                        ("PgvectorTypes", cached),
                    ]
                    for name, configure in ways:
                        client, server, wall = measure(pg, target, configure, args.connections)
                        print(
                            f"| {route} | {name} | {round_no} | {client:.2f} | {server:.2f}"
                            f" | {wall:.2f} |",
                            flush=True,
                        )


if __name__ == "__main__":
    main()
