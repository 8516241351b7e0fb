"""Does trioindex's store path cost more per vector than a raw COPY into the same index, and
does that grow with the model's stored vectors?

For each base size in ``--sizes``, one database per variant, all in one embedded PostgreSQL,
each holding the same base vectors with the bit index built over them; then ``--extra`` more
vectors stored in **rounds**: each round every variant stores the same ``--round`` vectors
before the next round begins, so all of them run under the same load (the machine's load
drifts over minutes; variants run one after another would each see a different one):

* **head**: one-chunk documents (enqueued beforehand, outside the figure) through this
  checkout's claim and ``functions.sql`` (claim, parse, chunks, vectors and completion, groups
  of 20) into a model whose ``embeddings`` hold the base (one document:
  :func:`bench.index_store.load_base`);
* **baseline**: the same with the ``functions.sql`` of git revision ``--baseline`` (and this
  checkout's claim when that revision's functions hold none: ``bench.sql_floor.use_functions``);
* **table COPY**: the vectors COPYed straight into ``embeddings`` for chunks written
  beforehand: the table's own cost, without the store path's bookkeeping;
* **raw COPY**: a bare table with the same bit HNSW index, the vectors COPYed into it.

The figure is the CPU of the variant's own backend (``/proc``) per stored vector: what its
statements cost PostgreSQL, with the server's shared background work (autovacuum, the WAL
writer, checkpoints) left out for every variant alike. The databases are ``VACUUM ANALYZE``d
after the base load (the statistics then say one version holds every chunk: the plans a large
first document leaves). Run ``.venv/bin/python -m bench.store_growth``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt
import psutil
import psycopg

from bench.common import BenchPostgres, machine_info
from bench.harness import chunk_texts
from bench.index_store import (
    Version,
    add_chunks,
    base_document,
    copy_embeddings,
    load_base,
    register_bench_worker,
)
from bench.peer import print_profile
from bench.sql_floor import GROUP, Corpus, Setup, functions_at, group_functions, use_functions
from testkit.jobs import enqueue_text
from trioindex.db.pool import connect
from trioindex.db.vector_index import hnsw_parameters

Matrix = npt.NDArray[np.float32]


def backend_cpu_ms(conn: psycopg.Connection[Any]) -> Callable[[], float]:
    """A reader of the CPU ms ``conn``'s server process has used so far."""
    process = psutil.Process(conn.info.backend_pid)

    def read() -> float:
        times = process.cpu_times()
        return float(times.user + times.system) * 1e3

    return read


@attrs.define
class Variant:
    """One way of storing the extra vectors, in its own database (``url``): ``store`` stores
    ``extra[rows]`` and returns its backend's CPU ms for it."""

    name: str
    url: str
    store: Callable[[slice], float]
    spent_ms: float = 0.0
    stored: int = 0


def _rows(vectors: Matrix) -> str:
    return "".join("[" + ",".join(f"{x:.7g}" for x in v) + "]\n" for v in vectors)


def inline_vectors(url: str) -> None:
    """Keep ``embeddings``' vectors in their rows (``STORAGE MAIN``; pgvector's default,
    ``external``, puts a vector of over 2 KB in TOAST): for the rows written from here on."""
    with connect(url) as conn:
        conn.execute("ALTER TABLE embeddings ALTER COLUMN vector SET STORAGE MAIN")


def store_path(
    stack: contextlib.ExitStack, pg: BenchPostgres, base: Matrix, extra: Matrix,
    revision: str | None, *, inline: bool = False,
) -> Variant:  # fmt: skip
    url = stack.enter_context(pg.fresh_database("store_growth"))
    if inline:
        inline_vectors(url)
    model = load_base(url, base)
    if revision is not None:
        with connect(url) as conn:
            use_functions(functions_at(revision), conn)
    corpus = Corpus(chunk_texts(len(extra), characters=600, salt="index"), extra)
    enqueuer = stack.enter_context(connect(url))
    worker = stack.enter_context(connect(url))
    setup = Setup(model.id, register_bench_worker(worker), GROUP)
    cpu = backend_cpu_ms(worker)

    def store(rows: slice) -> float:
        with enqueuer.transaction():  # outside the figure: the enqueue is not the store path
            for i in range(rows.start, rows.stop):
                enqueue_text(enqueuer, model.id, f"d{i}", corpus.texts[i].encode())
        before = cpu()
        done = group_functions(worker, corpus, setup)
        if done != rows.stop - rows.start:
            raise RuntimeError(f"{done} documents stored, {rows.stop - rows.start} enqueued")
        return cpu() - before

    name = "head" if revision is None else "baseline"
    return Variant(f"{name} (inline)" if inline else name, url, store)


def table_copy(
    stack: contextlib.ExitStack, pg: BenchPostgres, base: Matrix, extra: Matrix,
    *, inline: bool = False,
) -> Variant:  # fmt: skip
    """The extra vectors COPYed straight into trioindex's ``embeddings`` for chunks written
    beforehand: the table's own cost (its btree indexes, constraints, wider rows) without the
    store path's bookkeeping."""
    url = stack.enter_context(pg.fresh_database("store_growth_table"))
    if inline:
        inline_vectors(url)
    model = load_base(url, base)
    conn = stack.enter_context(connect(url))
    version: Version = base_document(conn)
    with conn.transaction():
        ids = add_chunks(conn, version, len(base), len(extra))
    cpu = backend_cpu_ms(conn)

    def store(rows: slice) -> float:
        before = cpu()
        with conn.transaction():
            copy_embeddings(conn, model, version, ids[rows], extra[rows])
        return cpu() - before

    return Variant("table (inline)" if inline else "table", url, store)


def raw_copy(
    stack: contextlib.ExitStack, pg: BenchPostgres, base: Matrix, extra: Matrix
) -> Variant:
    """A bare ``vector`` table with the same bit HNSW index over the same base."""
    dim = int(base.shape[1])
    url = stack.enter_context(pg.fresh_database("store_growth_raw"))
    conn = stack.enter_context(psycopg.connect(url, autocommit=True))
    conn.execute(f"CREATE TABLE raw (v vector({dim}) NOT NULL)")
    with conn.cursor().copy("COPY raw (v) FROM STDIN") as copy:
        copy.write(_rows(base))
    conn.execute("SET maintenance_work_mem = '1GB'")
    m, ef_construction = hnsw_parameters(dim)
    conn.execute(
        f"CREATE INDEX ON raw USING hnsw ((binary_quantize(v)::bit({dim})) bit_hamming_ops)"
        f" WITH (m = {m}, ef_construction = {ef_construction})"
    )
    conn.execute("RESET maintenance_work_mem")
    cpu = backend_cpu_ms(conn)

    def store(rows: slice) -> float:
        before = cpu()
        with conn.transaction(), conn.cursor().copy("COPY raw (v) FROM STDIN") as copy:
            copy.write(_rows(extra[rows]))
        return cpu() - before

    return Variant("raw", url, store)


def quiesce(pg: BenchPostgres, urls: list[str]) -> None:
    for url in urls:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
    with psycopg.connect(pg.admin_url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def one_size(
    pg: BenchPostgres, base: Matrix, extra: Matrix, args: argparse.Namespace
) -> dict[str, Any]:
    """Every variant over ``base``, then ``extra`` stored in interleaved rounds."""
    with contextlib.ExitStack() as stack:
        variants = [store_path(stack, pg, base, extra, None)]
        if args.baseline:
            variants.append(store_path(stack, pg, base, extra, args.baseline))
        variants += [table_copy(stack, pg, base, extra), raw_copy(stack, pg, base, extra)]
        if args.inline:
            variants += [
                store_path(stack, pg, base, extra, None, inline=True),
                table_copy(stack, pg, base, extra, inline=True),
            ]
        quiesce(pg, [v.url for v in variants])
        if args.profile:
            pg.count_every_statement(variants[0].url)
        began = time.monotonic()
        rounds = 0
        for start in range(0, len(extra), args.round):
            rows = slice(start, min(start + args.round, len(extra)))
            # the variants' order rotates, so none is always first after a checkpoint
            for i in range(len(variants)):
                variant = variants[(i + rounds) % len(variants)]
                variant.spent_ms += variant.store(rows)
                variant.stored += rows.stop - rows.start
            rounds += 1
        seconds = time.monotonic() - began
        if args.profile:
            print_profile(pg, variants[0].url, variants[0].stored)
    return {"stored": len(base), "seconds": seconds, "rounds": rounds} | {
        v.name: v.spent_ms / v.stored for v in variants
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.store_growth", description=__doc__)
    parser.add_argument("--sizes", default="10000,100000", help="base vectors, comma-separated")
    parser.add_argument("--extra", type=int, default=400, help="vectors stored per variant")
    parser.add_argument("--round", type=int, default=100, help="vectors per variant per round")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument(
        "--baseline", default="main", help="git revision to compare with ('': none)"
    )
    parser.add_argument("--seed", type=int, default=28)
    parser.add_argument(
        "--inline",
        action="store_true",
        help="also head and table COPY with the vectors kept in the row (STORAGE MAIN)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="print head's statements per vector (slows the server: not a run for the ratios)",
    )
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    began = time.monotonic()
    load = os.getloadavg()
    results: list[dict[str, Any]] = []
    with BenchPostgres() as pg:
        info = machine_info(pg.admin_url)
        for size in (int(s) for s in args.sizes.split(",")):
            base = rng.standard_normal((size, args.dim)).astype(np.float32)
            extra = rng.standard_normal((args.extra, args.dim)).astype(np.float32)
            row = one_size(pg, base, extra, args)
            print(row, flush=True)
            results.append(row)
    print(f"\n{info}\n1-minute load average at the start {load[0]:.1f}, at the end "
          f"{os.getloadavg()[0]:.1f}; {time.monotonic() - began:.0f} s")  # fmt: skip
    m, ef_construction = hnsw_parameters(args.dim)
    print(
        f"\n{args.dim} dimensions, bit graph (m {m}, ef_construction {ef_construction}), "
        f"{args.extra:,} vectors stored per variant in rounds of {args.round}; "
        "backend CPU ms per vector\n"
    )
    names = ["head", "table", "raw"] + (["baseline"] if args.baseline else [])
    names += ["head (inline)", "table (inline)"] if args.inline else []
    print(
        "| stored vectors | " + " | ".join(f"{n} ms/vector" for n in names)
        + " | head ÷ raw | table ÷ raw | head − table ms"
        + (f" | {args.baseline} ÷ raw" if args.baseline else "") + " |"
    )  # fmt: skip
    print("|---:" * (len(names) + 4 + bool(args.baseline)) + "|")
    for r in results:
        cells = [f"{r['stored']:,}"] + [f"{r[n]:.3f}" for n in names]
        cells += [f"{r['head'] / r['raw']:.2f}", f"{r['table'] / r['raw']:.2f}"]
        cells += [f"{r['head'] - r['table']:.3f}"]
        if args.baseline:
            cells.append(f"{r['baseline'] / r['raw']:.2f}")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
