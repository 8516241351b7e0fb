"""Does trioindex's store path cost more per vector as the model's stored vectors grow?

For each base size in ``--sizes``: a model whose ``embeddings`` already hold that many vectors
(one document, its bit index built: :func:`bench.index_store.load_base`), then ``--extra``
one-chunk documents indexed through the worker's group statements (claim, parse, chunks,
vectors and completion, groups of 20), each in a fresh database of one embedded PostgreSQL:

* **head**: this checkout's claim and ``functions.sql``;
* **baseline**: the claim statement and ``functions.sql`` of git revision ``--baseline``;
* **table COPY**: the extra vectors COPYed straight into ``embeddings`` (batches of 100) for
  chunks written beforehand: the table's own cost, without the store path's bookkeeping;
* **raw COPY**: the same base vectors in a bare table with the same bit HNSW index, and the
  extra vectors COPYed into it in batches of 100.

The figure is PostgreSQL's CPU (the server's, the backends' once they exited) per stored
vector, after ``VACUUM ANALYZE`` (the statistics then say one version holds every chunk:
the plans a large first document leaves). Run ``.venv/bin/python -m bench.store_growth``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg

from bench.common import BenchPostgres, machine_info
from bench.index_store import (
    add_chunks,
    base_document,
    copy_embeddings,
    enqueue_documents,
    load_base,
    store_documents,
)
from bench.peer import print_profile
from bench.sql_floor import functions_at, use_functions
from trioindex.db import jobs
from trioindex.db.pool import connect
from trioindex.db.vector_index import hnsw_parameters


def claim_sql_at(revision: str) -> str:
    """The claim statement of ``trioindex.db.jobs`` at git revision ``revision``."""
    text = subprocess.run(
        ["git", "show", f"{revision}:src/trioindex/db/jobs.py"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    found = re.search(r'^_CLAIM_SQL = """(.*?)"""', text, re.S | re.M)
    if found is None:
        raise RuntimeError(f"no _CLAIM_SQL in {revision}'s db/jobs.py")
    return found.group(1)


@contextmanager
def claim_sql(text: str | None) -> Iterator[None]:
    """Claims run ``text`` (None: this checkout's statement) inside the block."""
    mine = jobs._CLAIM_SQL
    jobs._CLAIM_SQL = text if text is not None else mine
    try:
        yield
    finally:
        jobs._CLAIM_SQL = mine


def measured(
    pg: BenchPostgres, url: str, work: Callable[[], int], *, profile: bool = False
) -> float:
    """PostgreSQL CPU ms per unit of ``work`` (which returns its units), after a quiesce;
    with ``profile``, prints where the server's time went per unit (and slows it)."""
    pg.quiesce(url)
    if profile:
        pg.count_every_statement(url)
    before = pg.counters(url, settle_seconds=2)
    units = work()
    after = pg.counters(url, settle_seconds=5)
    if profile:
        print_profile(pg, url, units)
    return (after.server_cpu_s - before.server_cpu_s) / units * 1e3


def store_path(
    pg: BenchPostgres,
    base: npt.NDArray[np.float32],
    extra: npt.NDArray[np.float32],
    revision: str | None,
    *,
    profile: bool = False,
) -> float:
    with pg.fresh_database("store_growth") as url:
        model = load_base(url, base)
        if revision is not None:
            with connect(url) as conn:
                use_functions(functions_at(revision), conn)
        corpus, setup = enqueue_documents(url, model, extra)
        with claim_sql(None if revision is None else claim_sql_at(revision)):
            work = lambda: store_documents(url, corpus, setup)  # noqa: E731
            return measured(pg, url, work, profile=profile)


def table_copy(
    pg: BenchPostgres, base: npt.NDArray[np.float32], extra: npt.NDArray[np.float32]
) -> float:
    """The extra vectors COPYed straight into trioindex's ``embeddings`` (batches of 100) for
    chunks written beforehand: the table's own cost (its btree indexes, constraints, wider
    rows) without the store path's bookkeeping."""
    with pg.fresh_database("store_growth_table") as url:
        model = load_base(url, base)
        with connect(url) as conn:
            version = base_document(conn)
            with conn.transaction():
                ids = add_chunks(conn, version, len(base), len(extra))

        def copy_extra() -> int:
            with connect(url) as conn:
                for start in range(0, len(extra), 100):
                    with conn.transaction():
                        batch = slice(start, start + 100)
                        copy_embeddings(conn, model, version, ids[batch], extra[batch])
            return len(extra)

        return measured(pg, url, copy_extra)


def _rows(vectors: npt.NDArray[np.float32]) -> str:
    return "".join("[" + ",".join(f"{x:.7g}" for x in v) + "]\n" for v in vectors)


def raw_copy(
    pg: BenchPostgres, base: npt.NDArray[np.float32], extra: npt.NDArray[np.float32]
) -> float:
    dim = int(base.shape[1])
    with pg.fresh_database("store_growth_raw") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE raw (v vector({dim}) NOT NULL)")
            with conn.cursor().copy("COPY raw (v) FROM STDIN") as copy:
                copy.write(_rows(base))
            conn.execute("SET maintenance_work_mem = '1GB'")
            m, ef_construction = hnsw_parameters(dim)
            conn.execute(
                f"CREATE INDEX ON raw USING hnsw ((binary_quantize(v)::bit({dim})) bit_hamming_ops)"
                f" WITH (m = {m}, ef_construction = {ef_construction})"
            )

        def copy_extra() -> int:
            with psycopg.connect(url) as conn:
                for start in range(0, len(extra), 100):
                    with conn.transaction(), conn.cursor().copy("COPY raw (v) FROM STDIN") as copy:
                        copy.write(_rows(extra[start : start + 100]))
            return len(extra)

        return measured(pg, url, copy_extra)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.store_growth", description=__doc__)
    parser.add_argument("--sizes", default="10000,100000", help="base vectors, comma-separated")
    parser.add_argument("--extra", type=int, default=400, help="documents indexed per variant")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument(
        "--baseline", default="main", help="git revision to compare with ('': none)"
    )
    parser.add_argument("--seed", type=int, default=28)
    parser.add_argument(
        "--profile", action="store_true", help="print each variant's statements per vector"
    )
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    began = time.monotonic()
    results: list[dict[str, Any]] = []
    with BenchPostgres() as pg:
        info = machine_info(pg.admin_url)
        for size in (int(s) for s in args.sizes.split(",")):
            base = rng.standard_normal((size, args.dim)).astype(np.float32)
            extra = rng.standard_normal((args.extra, args.dim)).astype(np.float32)
            row = {
                "stored": size,
                "baseline": (
                    store_path(pg, base, extra, args.baseline) if args.baseline else float("nan")
                ),
                "head": store_path(pg, base, extra, None, profile=args.profile),
                "table": table_copy(pg, base, extra),
                "raw": raw_copy(pg, base, extra),
            }
            print(row, flush=True)
            results.append(row)
    print(f"\n{info}\nload average at the end: {os.getloadavg()}; {time.monotonic() - began:.0f} s")
    print(
        f"\n| stored vectors | {args.baseline} ms/vector | head ms/vector "
        f"| table COPY ms/row | raw COPY ms/row | {args.baseline} ÷ raw | head ÷ raw "
        "| table ÷ raw |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['stored']:,} | {r['baseline']:.2f} | {r['head']:.2f} | {r['table']:.2f} "
            f"| {r['raw']:.2f} | {r['baseline'] / r['raw']:.2f} | {r['head'] / r['raw']:.2f} "
            f"| {r['table'] / r['raw']:.2f} |"
        )


if __name__ == "__main__":
    main()
