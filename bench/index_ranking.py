"""Where a ranking's time goes at scale, and what cuts it: the bit graph's candidates and their
exact re-rank on one model whose ``embeddings`` hold ``--n`` clustered vectors.

The base vectors (``bench.index_scale.clustered``, 1024 dimensions by default) are stored in
trioindex's own ``embeddings`` as one served document's chunks, twice: in a database as
migrated (the ``vector`` column's storage is pgvector's ``external``: a 4 KB vector lives out
of line, in TOAST) and in one whose column is ``SET STORAGE MAIN`` before the load (the vector
inline in the row). The model's default bit index is built in both
(:func:`trioindex.db.vector_index.build_vector_index`). Then the same queries run through
every variant, the variants taking turns query by query (so the machine's load drifting over
the run falls on all of them alike), each on its own connection:

* **search**: :func:`trioindex.db.search.nearest_chunks` itself (its round trips, the final
  join to the chunks' text) on either database, this checkout's and git revision
  ``--baseline``'s;
* **SQL**: the candidate statement alone (one round trip): the graph only (no re-rank), and the
  graph with the exact re-rank, at several ``hnsw.ef_search`` and candidates per result (R), on
  either database. (Re-ranking from narrow side tables holding only ``(chunk_id, vector)`` or
  ``(chunk_id, halfvec)`` inline was slower than either at 200,000: index-scale.md, run 9.)

The server CPU per query is the CPU time of the variant's own backend (``/proc``).

recall@10 is against the exact top 10 (numpy); latency is the client's wall time per query.
``EXPLAIN (ANALYZE, BUFFERS)`` of the re-ranked statement is printed for both databases. Run
``.venv/bin/python -m bench.index_ranking`` (``--n 20000`` for a quick look).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
import types
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt
import psutil
import psycopg
from pgvector import Vector
from pgvector.psycopg import register_vector

from bench.common import BenchPostgres, machine_info, percentiles
from bench.index_scale import QUERIES, K, clustered, copy_stream
from bench.index_store import Version, add_chunks, register_bench_worker
from testkit.jobs import enqueue_text
from trioindex.db.jobs import claim_jobs
from trioindex.db.models import EmbeddingModel, ensure_model
from trioindex.db.pool import connect
from trioindex.db.search import DEFAULT_HNSW, NO_FILTERS, nearest_chunks
from trioindex.db.vector_index import (
    IndexState,
    build_vector_index,
    candidate_count,
    index_state,
    quantized_sql,
)

Matrix = npt.NDArray[np.float32]
MODEL = "index-ranking-model"


def load(url: str, base: Matrix, *, inline: bool) -> tuple[EmbeddingModel, dict[str, int]]:
    """The model with ``base`` stored as one served document's chunks and its index built; the
    chunk ids' order is ``base``'s (returned: chunk id -> row)."""
    dim = int(base.shape[1])
    with connect(url) as conn:
        if inline:
            conn.execute("ALTER TABLE embeddings ALTER COLUMN vector SET STORAGE MAIN")
        model = ensure_model(conn, MODEL, dim)
        doc = enqueue_text(conn, model.id, "base", b"base")
        claim_jobs(conn, register_bench_worker(conn), 1, 86_400.0)
        version = Version(doc.document_id, doc.version_id)
        with conn.transaction():
            ids = add_chunks(conn, version, 0, len(base))
            conn.execute(f"CREATE TEMP TABLE staged (id integer, v vector({dim}))")
            for start in range(0, len(base), 10_000):  # a stream per COPY: 40 MB at a time
                rows = np.arange(start, min(start + 10_000, len(base)), dtype=np.int64)
                with conn.cursor().copy("COPY staged (id, v) FROM STDIN (FORMAT binary)") as copy:
                    copy.write(copy_stream(rows, base[rows]))
            conn.execute(
                """INSERT INTO embeddings (chunk_id, document_id, document_version_id,
                       embedding_model_id, vector, dimension, vector_sha256)
                   SELECT c.id, c.document_id, c.document_version_id, %s, s.v, %s,
                          repeat('c', 64)
                   FROM staged s JOIN document_chunks c
                     ON c.document_version_id = %s AND c.chunk_index = s.id""",
                (model.id, dim, version.version_id),
            )
            # served as a completion would serve it (search ranks the served versions only)
            conn.execute(
                """INSERT INTO served_versions (document_id, embedding_model_id,
                       document_version_id, chunks, text_length)
                   VALUES (%s, %s, %s, %s, %s)""",
                (version.document_id, model.id, version.version_id, len(base), len(base)),
            )
        conn.execute("SET maintenance_work_mem = '1GB'")
        began = time.monotonic()
        if not build_vector_index(conn, model, min_vectors=1):
            raise RuntimeError("the default index was not built")
        print(f"  index built in {time.monotonic() - began:.0f} s", flush=True)
        conn.execute("VACUUM ANALYZE")
        sizes = conn.execute(
            """SELECT pg_table_size('embeddings') AS embeddings,
                      pg_relation_size(%s) AS graph""",
            (model.index_name,),
        ).fetchone()
        print(f"  sizes (MB): { {k: v >> 20 for k, v in (sizes or {}).items()} }", flush=True)
    return model, {str(chunk): row for row, chunk in enumerate(ids)}


def candidate_sql(url: str, model: EmbeddingModel, candidates: int, *, rerank: bool) -> str:
    """The candidate statement of ``nearest_chunks`` without a filter: re-ranked by the exact
    cosine of the stored vector, or (``rerank`` False) in the graph's order only."""
    dim = model.dimension
    with connect(url) as conn:
        order = f"{quantized_sql(conn, dim, 'e.vector')} <~> {quantized_sql(conn, dim, '%(q)s')}"
    graph = f"""SELECT e.chunk_id{{score}} FROM embeddings e
                JOIN served_versions s ON s.document_version_id = e.document_version_id
                                      AND s.embedding_model_id = '{model.id}'
                WHERE e.embedding_model_id = '{model.id}'
                ORDER BY {order} LIMIT {candidates}"""
    if not rerank:
        return graph.format(score="")
    score = f", 1 - (e.vector::vector({dim}) <=> %(q)s::vector({dim})) AS score"
    return f"SELECT chunk_id FROM ({graph.format(score=score)}) n ORDER BY score DESC LIMIT {K}"


@attrs.define
class Variant:
    name: str
    run: Callable[[Matrix], list[str]]
    backend: psutil.Process  # the connection's server process: its CPU per query
    latencies: list[float] = attrs.Factory(list)
    hits: int = 0
    cpu_s: float = 0.0


def _process(conn: psycopg.Connection[Any]) -> psutil.Process:
    return psutil.Process(conn.info.backend_pid)


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def sql_variant(
    stack: contextlib.ExitStack, url: str, name: str, sql: str, ef_search: int
) -> Variant:
    conn = stack.enter_context(psycopg.connect(url, autocommit=True))
    register_vector(conn)
    conn.execute(f"SET hnsw.ef_search = {ef_search}")
    conn.execute("SET hnsw.iterative_scan = strict_order")

    def run(q: Matrix) -> list[str]:
        return [str(r[0]) for r in conn.execute(sql, {"q": Vector(q)}).fetchall()]

    return Variant(name, run, _process(conn))


def module_at(revision: str, name: str) -> tuple[types.ModuleType, str]:
    """Module ``name`` (``trioindex.db.search``) as git revision ``revision`` has it, and its
    text."""
    path = "src/" + name.replace(".", "/") + ".py"
    text = subprocess.run(
        ["git", "show", f"{revision}:{path}"], check=True, capture_output=True, text=True
    ).stdout
    module = types.ModuleType(f"{name}_at_{revision}")
    exec(compile(text, f"{revision}:{path}", "exec"), module.__dict__)
    return module, text


def search_at(revision: str) -> Any:
    """``trioindex.db.search`` as git revision ``revision`` has it, over that revision's
    ``vector_index`` (its readiness check lived there); one from before the readiness check
    set the scan gets that check as it was (the index's state alone)."""
    here = sys.modules["trioindex.db.vector_index"]
    sys.modules["trioindex.db.vector_index"] = module_at(revision, "trioindex.db.vector_index")[0]
    try:
        module, text = module_at(revision, "trioindex.db.search")
    finally:
        sys.modules["trioindex.db.vector_index"] = here
    if "index_ready(conn, model)\n" in text:
        module.index_ready = lambda conn, model: index_state(conn, model) is IndexState.VALID
    return module


def search_variant(
    stack: contextlib.ExitStack, url: str, name: str, model: EmbeddingModel, search: Any = None
) -> Variant:
    """Vector search's own function (``search``: a module with another revision's)."""
    conn = stack.enter_context(connect(url))
    nearest = nearest_chunks if search is None else search.nearest_chunks

    def run(q: Matrix) -> list[str]:
        rows = nearest(conn, model, q.tolist(), K, filters=NO_FILTERS, hnsw=DEFAULT_HNSW)
        return [str(r["chunk_id"]) for r in rows]

    return Variant(name, run, _process(conn))


def explain(url: str, sql: str, q: Matrix, ef_search: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        register_vector(conn)
        conn.execute(f"SET hnsw.ef_search = {ef_search}")
        conn.execute("SET hnsw.iterative_scan = strict_order")
        for _ in range(2):  # the second run's buffers: a warm cache, as the timed queries see
            plan = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, {"q": Vector(q)}
            ).fetchall()
        # the query's literal (thousands of digits) cut short
        print("\n".join("    " + r[0][:160] for r in plan), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.index_ranking", description=__doc__)
    parser.add_argument("--n", type=int, default=200_000, help="base vectors")
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--queries", type=int, default=QUERIES)
    parser.add_argument("--baseline", default="main", help="git revision of the other search")
    args = parser.parse_args(argv)
    began, load_start = time.monotonic(), os.getloadavg()
    data = clustered(args.n, 10_000, args.dim)  # the queries of index_scale's run at this size
    base, queries = data.base, data.queries[: args.queries]
    truth = np.argsort(-(queries @ base.T), axis=1)[:, :K]
    with BenchPostgres() as pg, contextlib.ExitStack() as stack:
        info = machine_info(pg.admin_url)
        urls, models, rows = {}, {}, {}
        for storage in ("toast", "inline"):
            print(f"loading {args.n} vectors ({storage})", flush=True)
            urls[storage] = stack.enter_context(pg.fresh_database(f"ranking_{storage}"))
            models[storage], rows[storage] = load(urls[storage], base, inline=storage == "inline")
        default = candidate_count(K, args.dim)
        toast = urls["toast"]
        for storage, url in urls.items():
            print(f"EXPLAIN, {storage}, R {default // K}, ef_search {default}:")
            sql = candidate_sql(url, models[storage], default, rerank=True)
            explain(url, sql, queries[0], default)
        baseline = search_at(args.baseline)
        variants = [
            search_variant(stack, urls[s], f"search ({s})", models[s]) for s in ("toast", "inline")
        ] + [
            search_variant(stack, urls[s], f"{args.baseline}'s search ({s})", models[s], baseline)
            for s in ("toast", "inline")
        ]
        settings = [(20, 200), (20, 100), (15, 150), (15, 100), (10, 100)]
        for storage, url in urls.items():
            for r, ef in settings:
                sql = candidate_sql(url, models[storage], r * K, rerank=True)
                name = f"SQL re-rank ({storage}), R {r}, ef {ef}"
                variants.append(sql_variant(stack, url, name, sql, ef))
        graph = candidate_sql(toast, models["toast"], default, rerank=False)
        name = f"SQL graph only, {default} candidates, ef {default}"
        variants.append(sql_variant(stack, toast, name, graph, default))
        for v in variants:  # warm each connection's cache and plan
            for q in queries[:3]:
                v.run(q)
        for qi, q in enumerate(queries):
            wanted = set(truth[qi].tolist())
            for i in range(len(variants)):
                v = variants[(i + qi) % len(variants)]  # rotate: none always first
                cpu, t = _cpu_s(v.backend), time.perf_counter()
                got = v.run(q)
                v.latencies.append((time.perf_counter() - t) * 1e3)
                v.cpu_s += _cpu_s(v.backend) - cpu
                row_of = rows["inline" if "inline" in v.name else "toast"]
                v.hits += len({row_of[c] for c in got[:K]} & wanted)
    load_end = os.getloadavg()
    print(f"\n{info}")
    print(
        f"1-minute load at the start {load_start[0]:.1f}, at the end {load_end[0]:.1f}; "
        f"{time.monotonic() - began:.0f} s; {args.n:,} vectors of {args.dim} dimensions, "
        f"{len(queries)} queries\n"
    )
    base_p50 = percentiles(variants[0].latencies, (50,))["p50"]
    print("| variant | recall@10 | p50 ms | p95 ms | p50 × search (toast) | server CPU ms/query |")
    print("|---|---:|---:|---:|---:|---:|")
    for v in variants:
        p = percentiles(v.latencies, (50, 95))
        recall = v.hits / (K * len(queries)) if "graph only" not in v.name else float("nan")
        print(
            f"| {v.name} | {recall:.3f} | {p['p50']:.1f} | {p['p95']:.1f} "
            f"| {p['p50'] / base_p50:.2f} | {v.cpu_s / len(queries) * 1e3:.2f} |"
        )


if __name__ == "__main__":
    main()
