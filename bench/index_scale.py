"""The vector index at scale: what each pgvector representation costs to build, to grow and to
query, and what trioindex's own store path costs next to a raw COPY into the same index.

Two data sets, each in its own database of one embedded PostgreSQL 18 + pgvector:

* **clustered**: ``--n`` (200,000) base vectors of 1024 dimensions drawn around 1,000 random
  centres (seeded), then 10,000 more and 200 held-out queries from the same clusters;
* **real**: the local model's vectors (all-MiniLM-L6-v2, 384 dimensions) of chunks of the
  machine's manual pages and package documentation (``bench.index_corpus``: trioindex's chunker,
  cached under ``~/.cache/trioindex-bench/``): ``--real-n`` (100,000) base chunks, 10,000
  more, and 200 held-out chunks as queries.

For each data set, one table per index representation holds the same base vectors
(``v vector(D)``): **float32 HNSW** (``vector_cosine_ops``), **halfvec HNSW**
(``(v::halfvec(D))``, ``halfvec_cosine_ops``), **binary HNSW** (``(binary_quantize(v)::bit(D))``,
``bit_hamming_ops``, with trioindex's default build parameters and any others ``--bit-params``
names) and **no index**. Every index is built after the base load (m = 16,
ef_construction = 64 unless named, maintenance_work_mem 1 GB): its build time and size are recorded. The
10,000 more rows are then COPYed in batches of 100, the variants interleaved batch by batch,
each on its own connection; *insert CPU* is that backend's CPU time (``/proc``, via psutil)
per row. Queries run afterwards on one connection per variant: float32 and halfvec order by
their cosine distance through the index at ``hnsw.ef_search`` 40 and 100; binary takes the
R × 10 nearest by Hamming distance through the index (ef_search = max(40, R × 10), R = 4, 10,
20 and 40), then re-ranks them by exact cosine on the float32 vectors. recall@10 is against the exact
top 10 (numpy over every stored vector); *recall@10, ties* counts a returned vector as found when
it is as near as the exact 10th (ann-benchmarks' definition), since a corpus with repeated
chunks has many equally near vectors and an exact top 10 that picks among them arbitrarily;
latency is the client's wall time per query.

**The store path** (``--store``): the clustered set's base vectors are loaded into trioindex's
own ``embeddings`` table (one model, one document with N chunks: the rows any deployment has
after indexing), the model's default index is built by :func:`build_vector_index`, and the
10,000 more vectors are indexed as 10,000 one-chunk documents by the worker's group statements
(the claim, then ``store_documents_many``: a small document stored whole, groups of 20,
as ``bench.sql_floor`` does). Its PostgreSQL CPU per vector (the server's, enqueue excluded) is
compared with the raw COPY into the table of the same representation above.

Run ``.venv/bin/python -m bench.index_scale`` (``--quick``: 20,000 base vectors, real set
skipped unless cached; ``--n 0``: the real set alone, without the store path).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt
import psutil  # type: ignore[import-untyped]
import psycopg

from bench.common import (
    BenchPostgres,
    Panel,
    Session,
    add_out,
    bench_parser,
    machine_info,
    markdown_table,
    page_head,
    percentiles,
    plot_panels,
)
from trioindex.db.vector_index import hnsw_parameters

Matrix = npt.NDArray[np.float32]

EXTRA = 10_000
QUERIES = 200
BATCH = 100
K = 10
M, EF_CONSTRUCTION = 16, 64
EF_SEARCH = (40, 100)
RERANK = (4, 10, 20, 40)
SEED = 28


# ---------------------------------------------------------------------------------------------
# data


@attrs.frozen
class DataSet:
    name: str
    base: Matrix
    extra: Matrix
    queries: Matrix

    @property
    def dimension(self) -> int:
        return int(self.base.shape[1])


def _unit(matrix: Matrix) -> Matrix:
    unit: Matrix = (matrix / np.linalg.norm(matrix, axis=1, keepdims=True)).astype(np.float32)
    return unit


def clustered(n: int, extra: int = EXTRA, dimension: int = 1024, centres: int = 1000) -> DataSet:
    """Unit vectors around ``centres`` random centres (noise a little larger than the spread
    between near centres, so neighbourhoods overlap as real embeddings' do)."""
    rng = np.random.default_rng(SEED)
    middles = rng.standard_normal((centres, dimension), dtype=np.float32)
    total = n + extra + QUERIES
    which = rng.integers(0, centres, total)
    points = middles[which] + 0.9 * rng.standard_normal((total, dimension), dtype=np.float32)
    points = _unit(points)
    return DataSet("clustered", points[:n], points[n : n + extra], points[n + extra :])


def real(n: int, extra: int) -> DataSet:
    """The corpus's first ``n + extra`` chunks and ``QUERIES`` held out after them; fewer
    (a tenth of them added) when the cache holds fewer."""
    from bench.index_corpus import cached_count, real_vectors

    if cached_count() < n + extra + QUERIES:
        extra = min(extra, (cached_count() - QUERIES) // 10)
        n = cached_count() - QUERIES - extra
    if n < 1000:
        raise SystemExit(f"the cache holds {cached_count()} real vectors")
    vectors = real_vectors(n + extra + QUERIES)
    return DataSet("real", vectors[:n], vectors[n : n + extra], vectors[n + extra :])


#: Cosine similarity within which a returned vector ties the exact 10th (float32 rounding).
TIE_TOLERANCE = 1e-5


def exact_top(data: DataSet) -> npt.NDArray[np.int64]:
    """Each query's exact 10 nearest by cosine among base + extra (ids 0..N+EXTRA-1)."""
    stored = np.concatenate([data.base, data.extra])
    tops = []
    for start in range(0, len(data.queries), 50):
        scores = data.queries[start : start + 50] @ stored.T
        tops.append(np.argsort(-scores, axis=1)[:, :K])
    return np.concatenate(tops)


_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8
_COPY_TRAILER = b"\xff\xff"


def binary_vectors(matrix: Matrix) -> npt.NDArray[np.void]:
    """Each row as pgvector's binary ``vector`` value (dimension, 0, big-endian floats)."""
    dim = int(matrix.shape[1])
    out = np.zeros(len(matrix), dtype=[("dim", ">u2"), ("unused", ">u2"), ("x", ">f4", dim)])
    out["dim"] = dim
    out["x"] = matrix
    return out


def copy_stream(ids: npt.NDArray[np.int64], matrix: Matrix) -> bytes:
    """A binary COPY of ``(id integer, v vector)`` rows, built with numpy (no per-float text)."""
    vectors = binary_vectors(matrix)
    rows = np.zeros(
        len(matrix),
        dtype=[
            ("n", ">i2"),
            ("id_len", ">i4"),
            ("id", ">i4"),
            ("v_len", ">i4"),
            ("v", vectors.dtype),
        ],
    )
    rows["n"], rows["id_len"], rows["id"] = 2, 4, ids
    rows["v_len"], rows["v"] = vectors.dtype.itemsize, vectors
    return _COPY_HEADER + rows.tobytes() + _COPY_TRAILER


def _copy_rows(conn: psycopg.Connection[Any], table: str, matrix: Matrix, first_id: int) -> None:
    ids = np.arange(first_id, first_id + len(matrix), dtype=np.int64)
    with conn.cursor().copy(f"COPY {table} (id, v) FROM STDIN (FORMAT binary)") as copy:
        copy.write(copy_stream(ids, matrix))


# ---------------------------------------------------------------------------------------------
# index variants


@attrs.frozen
class Variant:
    name: str
    index: str | None  # the index expression and operator class, None for no index
    order: str  # the query's ORDER BY, with %(q)s
    rerank: tuple[int, ...] = ()  # candidate factors R (binary: R × k by Hamming, then cosine)
    m: int = M
    ef_construction: int = EF_CONSTRUCTION


BIT = "binary HNSW + re-rank"


def bit_variant(dim: int, m: int, ef_construction: int) -> Variant:
    """The bit graph built with ``m`` and ``ef_construction``, named after them."""
    return Variant(
        f"{BIT} (m {m}, efc {ef_construction})",
        f"(binary_quantize(v)::bit({dim})) bit_hamming_ops",
        f"binary_quantize(v)::bit({dim}) <~> binary_quantize(%(q)s::vector)::bit({dim})",
        RERANK,
        m,
        ef_construction,
    )


def default_bit_variant(dim: int) -> Variant:
    """The bit graph with trioindex's default build parameters for ``dim`` dimensions."""
    m, ef_construction = hnsw_parameters(dim)
    return bit_variant(dim, m, ef_construction)


def variants(dim: int, bit_params: Sequence[tuple[int, int]] = ()) -> list[Variant]:
    """Every representation (the bit graph with trioindex's defaults), then one more bit graph
    per ``(m, ef_construction)`` in ``bit_params``."""
    chosen = [
        Variant("no index", None, "v <=> %(q)s::vector"),
        Variant("float32 HNSW", "v vector_cosine_ops", "v <=> %(q)s::vector"),
        Variant(
            "halfvec HNSW",
            f"(v::halfvec({dim})) halfvec_cosine_ops",
            f"v::halfvec({dim}) <=> %(q)s::halfvec({dim})",
        ),
        default_bit_variant(dim),
    ]
    for m, ef_construction in bit_params:
        extra = bit_variant(dim, m, ef_construction)
        if extra not in chosen:
            chosen.append(extra)
    return chosen


def _table(variant: Variant) -> str:
    words = variant.name.split()
    slug = "".join(c for c in words[0] if c.isalnum())
    if variant.index is not None and variant.rerank:
        slug += f"_m{variant.m}_efc{variant.ef_construction}"
    return "t_" + slug


def backend_cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def _connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def build(url: str, data: DataSet, variant: Variant) -> dict[str, Any]:
    """The table with the base rows, then its index; build seconds and sizes."""
    table = _table(variant)
    with _connect(url) as conn:
        conn.execute(f"CREATE TABLE {table} (id integer PRIMARY KEY, v vector({data.dimension}))")
        for start in range(0, len(data.base), 10_000):
            _copy_rows(conn, table, data.base[start : start + 10_000], start)
        conn.execute(f"VACUUM ANALYZE {table}")
        seconds, size = 0.0, 0
        if variant.index is not None:
            conn.execute("SET maintenance_work_mem = '1GB'")
            began = time.monotonic()
            conn.execute(
                f"CREATE INDEX {table}_idx ON {table} USING hnsw ({variant.index})"
                f" WITH (m = {variant.m}, ef_construction = {variant.ef_construction})"
            )
            seconds = time.monotonic() - began
            row = conn.execute(f"SELECT pg_relation_size('{table}_idx')").fetchone()
            size = int(row[0]) if row else 0
        heap = conn.execute(f"SELECT pg_table_size('{table}')").fetchone()
    print(f"  {data.name} {variant.name}: built in {seconds:.1f} s, {size / 2**20:.0f} MB")
    return {
        "build_s": seconds,
        "index_mb": size / 2**20,
        "table_mb": (heap[0] if heap else 0) / 2**20,
    }


def insert_interleaved(url: str, data: DataSet, chosen: Sequence[Variant]) -> dict[str, float]:
    """COPY the extra rows in batches, the variants taking turns; backend CPU ms per row."""
    conns = [_connect(url) for _ in chosen]
    try:
        pids = [int(c.execute("SELECT pg_backend_pid()").fetchone()[0]) for c in conns]  # type: ignore[index]
        spent = [0.0] * len(chosen)
        first = len(data.base)
        for start in range(0, len(data.extra), BATCH):
            for i, (conn, variant) in enumerate(zip(conns, chosen, strict=True)):
                before = backend_cpu(pids[i])
                _copy_rows(conn, _table(variant), data.extra[start : start + BATCH], first + start)
                spent[i] += backend_cpu(pids[i]) - before
    finally:
        for conn in conns:
            conn.close()
    return {v.name: spent[i] / len(data.extra) * 1e3 for i, v in enumerate(chosen)}


def _query_sql(variant: Variant, dim: int, rerank: int | None) -> str:
    table = _table(variant)
    if rerank is None:
        return f"SELECT id FROM {table} ORDER BY {variant.order} LIMIT {K}"
    return (
        f"SELECT id FROM (SELECT id, v FROM {table} ORDER BY {variant.order}"
        f" LIMIT {rerank * K}) c ORDER BY v <=> %(q)s::vector LIMIT {K}"
    )


def query_settings(variant: Variant) -> Iterator[tuple[str, int | None, int | None]]:
    """(label, ef_search, R) for each way the variant is queried."""
    if variant.index is None:
        yield "exact", None, None
    elif variant.rerank:
        for r in variant.rerank:
            ef = min(1000, max(40, r * K))
            yield f"ef {ef}, R {r}", ef, r
    else:
        for ef in EF_SEARCH:
            yield f"ef {ef}", ef, None


def query(
    url: str, data: DataSet, variant: Variant, truth: npt.NDArray[np.int64]
) -> list[dict[str, Any]]:
    stored = np.concatenate([data.base, data.extra])
    tenth = np.sort(data.queries @ stored.T, axis=1)[:, -K]
    rows = []
    with _connect(url) as conn:
        conn.execute("SET hnsw.iterative_scan = strict_order")
        for label, ef, rerank in query_settings(variant):
            if ef is not None:
                conn.execute(f"SET hnsw.ef_search = {ef}")
            sql = _query_sql(variant, data.dimension, rerank)
            queries = data.queries if variant.index else data.queries[:20]
            for q in queries[:3]:  # warm the cache and the plan
                conn.execute(sql, {"q": _literal(q)}).fetchall()
            latencies, hits, tied_hits = [], 0, 0
            for qi, q in enumerate(queries):
                began = time.perf_counter()
                got = [r[0] for r in conn.execute(sql, {"q": _literal(q)}).fetchall()]
                latencies.append((time.perf_counter() - began) * 1e3)
                hits += len(set(got) & set(truth[qi].tolist()))
                tied_hits += int(np.sum(stored[got] @ q >= tenth[qi] - TIE_TOLERANCE))
            p = percentiles(latencies, (50, 95))
            rows.append(
                {
                    "setting": label,
                    "recall_at_10": hits / (K * len(queries)),
                    "recall_at_10_ties": tied_hits / (K * len(queries)),
                    "p50_ms": p["p50"],
                    "p95_ms": p["p95"],
                    "queries": len(queries),
                }
            )
            print(
                f"    {variant.name} {label}: recall {rows[-1]['recall_at_10']:.3f} "
                f"({rows[-1]['recall_at_10_ties']:.3f} with ties), "
                f"p50 {p['p50']:.1f} ms"
            )
    return rows


def _literal(vector: Matrix) -> str:
    return "[" + ",".join(f"{x:.7g}" for x in vector) + "]"


def run_data_set(
    pg: BenchPostgres, data: DataSet, bit_params: Sequence[tuple[int, int]] = ()
) -> dict[str, Any]:
    print(f"{data.name}: {len(data.base)} base vectors of {data.dimension} dimensions")
    truth = exact_top(data)
    chosen = variants(data.dimension, bit_params)
    result: dict[str, Any] = {
        "n": len(data.base),
        "extra": len(data.extra),
        "queries": len(data.queries),
        "dimension": data.dimension,
        "variants": {},
    }
    with pg.fresh_database(f"index_{data.name}") as url:
        with _connect(url) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        for variant in chosen:
            result["variants"][variant.name] = build(url, data, variant)
        inserted = insert_interleaved(url, data, chosen)
        for variant in chosen:
            entry = result["variants"][variant.name]
            entry["insert_cpu_ms_per_row"] = inserted[variant.name]
            entry["queries"] = query(url, data, variant, truth)
    return result


# ---------------------------------------------------------------------------------------------
# trioindex's store path


def store_path(pg: BenchPostgres, data: DataSet) -> dict[str, Any]:
    """PostgreSQL CPU per vector of the worker's group statements into an indexed model."""
    from bench.index_store import enqueue_documents, load_base, store_documents

    with pg.fresh_database("index_store") as url:
        model = load_base(url, data.base)
        corpus, setup = enqueue_documents(url, model, data.extra)
        pg.quiesce(url)
        before = pg.counters(url, settle_seconds=5)
        began = time.monotonic()
        stored = store_documents(url, corpus, setup)
        wall = time.monotonic() - began
        after = pg.counters(url, settle_seconds=10)
    cpu_ms = (after.server_cpu_s - before.server_cpu_s) / stored * 1e3
    print(f"  store path: {stored} documents, {cpu_ms:.2f} ms PostgreSQL CPU per vector")
    return {"documents": stored, "wall_s": wall, "postgres_cpu_ms_per_vector": cpu_ms}


# ---------------------------------------------------------------------------------------------
# report


def table_rows(result: dict[str, Any]) -> list[list[str]]:
    base = result["variants"]["float32 HNSW"]["insert_cpu_ms_per_row"]
    rows = []
    for name, entry in result["variants"].items():
        cpu = entry["insert_cpu_ms_per_row"]
        for q in entry["queries"]:
            rows.append(
                [
                    name,
                    f"{entry['build_s']:.0f}",
                    f"{entry['index_mb']:.0f}",
                    f"{cpu:.3f}",
                    f"{cpu / base:.2f}",
                    q["setting"],
                    f"{q['recall_at_10']:.3f}",
                    f"{q.get('recall_at_10_ties', float('nan')):.3f}",
                    f"{q['p50_ms']:.1f}",
                    f"{q['p95_ms']:.1f}",
                ]
            )
    return rows


HEADER = [
    "variant",
    "build s",
    "index MB",
    "insert CPU ms/row",
    "× float32 HNSW",
    "query",
    "recall@10",
    "recall@10, ties",
    "p50 ms",
    "p95 ms",
]


def markdown(
    session: Session, machine: dict[str, Any], figures: dict[str, Any]
) -> Callable[[str, float, str], str]:
    def page(date: str, elapsed: float, png: str) -> str:
        lines = page_head(
            "The vector index at scale",
            date,
            session.command,
            elapsed,
            machine,
            about=__doc__ or "",
        )
        for name, result in figures["data_sets"].items():
            lines += [
                f"## {name}: {result['n']:,} base vectors of {result['dimension']} dimensions,"
                f" {result['extra']:,} added, {result['queries']} queries",
                "",
                *markdown_table(HEADER, table_rows(result)),
                "",
            ]
        if "store" in figures:
            s = figures["store"]
            lines += ["## The store path", "", f"- {s['summary']}", ""]
        lines += [f"![figures]({png})", ""]
        return "\n".join(lines)

    return page


def plot(figures: dict[str, Any]) -> Callable[[Any], Any]:
    def draw(path: Any) -> Any:
        panels = []
        for name, result in figures["data_sets"].items():
            names = list(result["variants"])
            panels.append(
                Panel(
                    f"{name}: insert CPU",
                    "ms per row",
                    groups=names,
                    bars={
                        "insert": [result["variants"][n]["insert_cpu_ms_per_row"] for n in names]
                    },
                )
            )
        return plot_panels(path, panels, (5.0 * len(panels), 4.0))

    return draw


def parse_bit_params(text: str) -> list[tuple[int, int]]:
    """``"16:64,12:32"`` as ``[(16, 64), (12, 32)]``."""
    pairs = []
    for item in text.split(","):
        m, ef_construction = item.split(":")
        pairs.append((int(m), int(ef_construction)))
    return pairs


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(
        "index_scale", __doc__.splitlines()[0] if __doc__ else "", "20,000 base vectors"
    )
    parser.add_argument("--n", type=int, default=200_000, help="clustered base vectors (0: skip)")
    parser.add_argument("--real-n", type=int, default=100_000, help="real base chunks (0: skip)")
    parser.add_argument("--extra", type=int, default=EXTRA, help="vectors added to each index")
    parser.add_argument("--dim", type=int, default=1024, help="the clustered set's dimensions")
    parser.add_argument("--no-store", action="store_true", help="skip the store path")
    parser.add_argument(
        "--bit-params",
        type=parse_bit_params,
        default=[],
        help="more bit graphs beside the default, as m:ef_construction,... (e.g. 16:64,12:32)",
    )
    add_out(parser, "index-scale")
    args = parser.parse_args(argv)
    if args.quick:
        args.n = min(args.n, 20_000)
    session = Session.start("index-scale", args)
    session.command = session.command.replace("bench.index-scale", "bench.index_scale")
    figures: dict[str, Any] = {"data_sets": {}}
    with BenchPostgres() as pg:
        machine = machine_info(pg.admin_url)
        data = clustered(args.n, args.extra, args.dim) if args.n else None
        if data is not None:
            figures["data_sets"]["clustered"] = run_data_set(pg, data, args.bit_params)
        if data is not None and not args.no_store:
            store = store_path(pg, data)
            default = default_bit_variant(data.dimension).name
            raw = figures["data_sets"]["clustered"]["variants"][default]
            ratio = store["postgres_cpu_ms_per_vector"] / raw["insert_cpu_ms_per_row"]
            store["ratio_to_raw_copy"] = ratio
            store["summary"] = (
                f"trioindex's group statements into the default index: "
                f"{store['postgres_cpu_ms_per_vector']:.2f} ms of PostgreSQL CPU per vector, "
                f"{ratio:.2f}× the raw COPY into the same representation "
                f"({raw['insert_cpu_ms_per_row']:.3f} ms)"
            )
            print(store["summary"])
            figures["store"] = store
        if args.real_n:
            try:
                real_data = real(args.real_n, args.extra)
            except SystemExit as missing:
                print(f"real set skipped: {missing}")
            else:
                figures["data_sets"]["real"] = run_data_set(pg, real_data, args.bit_params)
        figures["load_average_end"] = [round(x, 2) for x in __import__("os").getloadavg()]
    return session.publish(machine, figures, plot(figures), markdown(session, machine, figures))


if __name__ == "__main__":
    raise SystemExit(main())
