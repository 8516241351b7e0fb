"""Search: ranking quality per mode (`just eval`) and latency over 100k chunks (`speed`).

**eval** — each labelled set of `bench/eval_sets.py` (known-item: installed manual pages and
Vim tutor lessons; progit: questions written over the Pro Git book's sections, English and
Korean) in its own database. The documents are chunked by the production chunker (the local
model's tokenizer, the default size and overlap), embedded by the local model
(all-MiniLM-L6-v2, offline) and stored as a worker stores them; every query then runs through
`Index.search_many` in each mode (documents, top 10; `--rerank-url`: hybrid re-ranked too).
nDCG@10 (binary relevance) and recall@10 are averaged per language. The fusion is tuned on the
same sets: the vector and text chunk rankings (50 deep, as hybrid fuses them) fused by
weighted RRF for each k and text weight of `FUSION_GRID`, grouped by document and scored alike.

**speed** — 100k chunks (10k documents × 10) with clustered unit vectors (2,000 Gaussian
clusters, so the HNSW graph sees structure like real embeddings) and text drawn from the
manual pages' vocabulary, for the local model's 384 dimensions and a server model's 1024
(bge-m3's size, served by testkit's fake TEI server over HTTP). 200 queries, one at a time:
a stored chunk's vector plus noise, and five of its words. Query embedding excluded: the
ranking call alone (`vector_ranking`, top 10 chunks) for each `ef_search` and iterative-scan
setting, with recall@10 against exact (brute-force) search; included: `Index.search_chunks`
end to end (serving-model check, query embedding, ranking) per mode, one mode after the other
(each counting its terms' document frequencies afresh), and hybrid's p50 and p95 against
vector's; then `Index.search` (5 documents, 3 marked chunks each) end to end, and the statements
PostgreSQL runs per query (`pg_stat_statements`) for `search_chunks`, `search` and
`search_many` of 10 queries. ``--model NAME`` runs only that model (repeatable).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import re
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import trio

from bench.common import (
    RESULTS_DIR,
    BenchPostgres,
    machine_info,
    markdown_table,
    page_head,
    percentiles,
    utc_now,
)
from bench.eval_sets import MAN, LabelledSet, Query, known_items, man_pages, progit
from testkit.embed_server import FakeEmbedServer
from testkit.search_corpus import IndexedDocument, store_indexed
from trioindex.api.index import Index
from trioindex.config import load_settings
from trioindex.db.models import ensure_model
from trioindex.db.pool import connect
from trioindex.db.vector_index import create_index_sql
from trioindex.search import (
    SEARCH_MODES,
    ChunkHit,
    HnswSettings,
    QueryRefused,
    RankedChunk,
    document_hits,
    fuse,
    vector_ranking,
)
from trioindex.search.statistics import forget
from trioindex.services import open_configured_embedder
from trioindex.worker.wiring import build_chunker

REPORT = RESULTS_DIR / "search.md"
#: The speed run's models: the local one, and a server model's size (served by the fake TEI).
SPEED_MODELS = [("sentence-transformers/all-MiniLM-L6-v2", 384), ("BAAI/bge-m3", 1024)]
#: The depth of each chunk ranking the fusion is tuned over (as `Index` ranks for hybrid).
TUNE_DEPTH = 50
#: The fusions tried on each set: (k, weight of the text list; the vector list's is 1).
FUSION_GRID = [(k, w) for k in (10, 30, 60, 100) for w in (0.5, 0.75, 1.0, 1.5, 2.0)]

# -- ranking quality --------------------------------------------------------------------------------


def scores(relevant: frozenset[str], ranked_keys: Sequence[str]) -> tuple[float, float]:
    """nDCG@10 and recall@10 of one query (binary relevance)."""
    dcg = sum(1 / math.log2(1 + r) for r, k in enumerate(ranked_keys[:10], 1) if k in relevant)
    ideal = sum(1 / math.log2(1 + r) for r in range(1, min(len(relevant), 10) + 1))
    return dcg / ideal, len(relevant & set(ranked_keys[:10])) / len(relevant)


def mean_scores(
    queries: Sequence[Query], rankings: Sequence[Sequence[str]]
) -> dict[str, dict[str, float]]:
    """nDCG@10 and recall@10 averaged per language."""
    by_lang: dict[str, list[tuple[float, float]]] = {}
    for query, keys in zip(queries, rankings, strict=True):
        by_lang.setdefault(query.lang, []).append(scores(query.relevant, keys))
    return {
        lang: {
            "queries": len(s),
            "ndcg@10": float(np.mean([n for n, _ in s])),
            "recall@10": float(np.mean([r for _, r in s])),
        }
        for lang, s in sorted(by_lang.items())
    }


def _ranked(hits: Sequence[ChunkHit]) -> list[RankedChunk]:
    return [
        RankedChunk(
            uuid.uuid5(uuid.NAMESPACE_URL, f"{h.document_id}/{h.chunk_index}"),
            h.score,
            h.document_key,
            h.document_id,
            h.version_no,
            None,
            h.chunk_index,
            h.text,
        )
        for h in hits
    ]


async def evaluate(
    url: str, home: Path, labelled: LabelledSet, rerank_url: str | None = None
) -> dict[str, Any]:
    settings = load_settings(environ={"TRIOINDEX_DATABASE_URL": url, "TRIOINDEX_HOME": str(home)})
    embedder = await open_configured_embedder(settings)
    chunker = build_chunker(settings, embedder)
    started = time.monotonic()
    chunked = [await trio.to_thread.run_sync(chunker.chunk, text) for _, text in labelled.documents]
    texts = [c.text for chunks in chunked for c in chunks]
    vectors = iter((await embedder.embed(texts)).matrix())
    await embedder.aclose()
    print(
        f"eval {labelled.name}: {len(labelled.documents)} documents, {len(texts)} chunks embedded"
        f" in {time.monotonic() - started:.0f}s"
    )
    figures: dict[str, Any] = {
        "set": labelled.name, "documents": len(labelled.documents), "chunks": len(texts),
        "modes": {}, "fusion": {},
    }  # fmt: skip
    questions = [q.text for q in labelled.queries]
    async with Index.open(settings) as index:
        docs = [
            IndexedDocument(key, [c.text for c in chunks], [next(vectors) for _ in chunks])
            for (key, _), chunks in zip(labelled.documents, chunked, strict=True)
        ]
        with connect(url) as conn:
            store_indexed(conn, index.model, docs)
        for mode in SEARCH_MODES:
            answers = await index.search_many(questions, mode=mode, top_k=10, chunks_per_document=1)
            keys = [[h.document_key for h in _hits(a)] for a in answers]
            figures["modes"][mode] = mean_scores(labelled.queries, keys)
            print(f"eval {labelled.name} {mode}: {figures['modes'][mode]}")
        if rerank_url:
            reranking = settings.with_overrides(search={"rerank_url": rerank_url})
            async with Index.open(reranking) as reranked:
                answers = await reranked.search_many(questions, top_k=10, chunks_per_document=1)
            keys = [[h.document_key for h in _hits(a)] for a in answers]
            figures["modes"]["hybrid + re-ranker"] = mean_scores(labelled.queries, keys)
        # the fusion's parameters, tuned on the two chunk rankings hybrid fuses
        lists = {
            mode: [
                _ranked(_hits(a))
                for a in await index.search_chunks_many(questions, mode=mode, top_k=TUNE_DEPTH)
            ]
            for mode in ("vector", "text")
        }
    figures["reference"] = mean_scores(labelled.queries, reference_bm25(labelled))
    print(f"eval {labelled.name} reference BM25: {figures['reference']}")
    for k, weight in FUSION_GRID:
        fused = [
            fuse([v, t], k=k, weights=(1.0, weight))
            for v, t in zip(lists["vector"], lists["text"], strict=True)
        ]
        keys = [[h.document_key for h in document_hits(f, 10, 1)] for f in fused]
        figures["fusion"][f"{k}/{weight}"] = mean_scores(labelled.queries, keys)
    return figures


def reference_bm25(labelled: LabelledSet) -> list[list[str]]:
    """The top 10 document keys per query by a reference BM25 (the ``bm25s`` package, Lucene's
    form, k1 = 1.2, b = 0.75, as Elasticsearch ranks BEIR's published BM25 figures): whole
    documents, lower-cased words of two or more letters, English stop words dropped, Snowball's
    English stemmer (PostgreSQL's ``english`` configuration stems with the same algorithm);
    Hangul words as written. From the bench dependency group (``just eval`` installs it)."""
    import bm25s
    import Stemmer

    stemmer = Stemmer.Stemmer("english")
    keys = [key for key, _ in labelled.documents]

    def tokens(texts: list[str]) -> Any:
        return bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False)

    retriever = bm25s.BM25(k1=1.2, b=0.75, method="lucene")
    retriever.index(tokens([text for _, text in labelled.documents]), show_progress=False)
    ranked = []
    for query in labelled.queries:
        found, scores = retriever.retrieve(
            tokens([query.text]), k=min(10, len(keys)), show_progress=False
        )
        ranked.append([keys[i] for i, score in zip(found[0], scores[0], strict=True) if score > 0])
    return ranked


def _hits(answer: Any) -> Any:
    assert not isinstance(answer, QueryRefused), answer
    return answer


# -- speed ------------------------------------------------------------------------------------------


def clustered(n: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    centres = rng.standard_normal((2000, dim))
    v = centres[rng.integers(0, 2000, n)] + 0.35 * rng.standard_normal((n, dim))
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def synthetic_corpus(
    chunks: int, dim: int
) -> tuple[np.random.Generator, np.ndarray, np.ndarray, list[str]]:
    """``chunks`` clustered ``dim``-dimension vectors and as many texts of 40 words drawn from
    the installed manual pages (seeded: the same corpus every run): the generator (to draw
    queries from next), the vectors, the words (one row per chunk) and the texts."""
    rng = np.random.default_rng(15)
    vectors = clustered(chunks, dim, rng)
    vocabulary = sorted(
        {
            w
            for _, t, _, _ in man_pages([MAN / "man1"], 100, "en")
            for w in re.findall(r"[a-z]{4,}", t)
        }
    )
    words = rng.choice(vocabulary, (chunks, 40))
    return rng, vectors, words, [" ".join(row) for row in words]


def timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[float, Any]:
    began = time.perf_counter()
    result = fn(*args, **kwargs)
    return (time.perf_counter() - began) * 1000, result


async def speed(
    pg: BenchPostgres,
    url: str,
    home: Path,
    model: str,
    dim: int,
    *,
    chunks: int,
    server_url: str | None,
) -> dict[str, Any]:
    env = {"TRIOINDEX_DATABASE_URL": url, "TRIOINDEX_HOME": str(home), "TRIOINDEX_EMBEDDING_MODEL": model,
           "TRIOINDEX_EMBEDDING_DIMENSION": str(dim)}  # fmt: skip
    if server_url:
        env |= {"TRIOINDEX_EMBEDDING_API": "tei", "TRIOINDEX_EMBEDDING_URL": server_url}
    settings = load_settings(environ=env)
    rng, vectors, words, texts = synthetic_corpus(chunks, dim)
    figures: dict[str, Any] = {"model": model, "dimension": dim, "chunks": chunks}
    with connect(url) as conn:
        registered = ensure_model(conn, model, dim)
        conn.execute(
            f"DROP INDEX IF EXISTS {registered.index_name}"
        )  # built once after the load, as pgvector advises
        docs = [
            IndexedDocument(
                f"doc-{d:05d}", texts[d * 10 : d * 10 + 10], vectors[d * 10 : d * 10 + 10]
            )
            for d in range(chunks // 10)
        ]
        load_ms, _ = timed(store_indexed, conn, registered, docs)
        conn.execute("SET maintenance_work_mem = '512MB'")
        index_ms, _ = timed(
            conn.execute,
            create_index_sql(conn, registered, concurrently=False),
        )
        # what migration 0020 costs on a table this size: the column computed for every row
        sql = resources.files("trioindex.db.migrations").joinpath("0020_english_search_vector.sql")
        rewrite_ms, _ = timed(conn.execute, sql.read_text())
        conn.execute("VACUUM ANALYZE")
        figures |= {"load_s": load_ms / 1000, "hnsw_build_s": index_ms / 1000}
        figures["migration_0020_s"] = rewrite_ms / 1000
        print(
            f"speed {model}: loaded {chunks} chunks in {load_ms / 1000:.0f}s, HNSW built in {index_ms / 1000:.0f}s"
        )
        picks = rng.integers(0, chunks, 200)
        queries = vectors[picks] + 0.02 * rng.standard_normal((200, dim)).astype(np.float32)
        queries /= np.linalg.norm(queries, axis=1, keepdims=True)
        exact = [set(np.argsort(-(vectors @ q))[:10]) for q in queries]
        key_of = {f"doc-{i // 10:05d}#{i % 10}": i for i in range(chunks)}
        runs = []
        for ef, scan in [
            (40, "strict_order"),
            (100, "strict_order"),
            (200, "strict_order"),
            (40, "relaxed_order"),
            (40, "off"),
        ]:
            hnsw, times, recall = HnswSettings(ef, scan), [], []
            for q, truth in zip(queries, exact, strict=True):
                ms, ranked = timed(vector_ranking, conn, registered, q, 10, hnsw=hnsw)
                times.append(ms)
                recall.append(
                    len(truth & {key_of[f"{r.document_key}#{r.chunk_index}"] for r in ranked}) / 10
                )
            runs.append(
                {
                    "ef_search": ef,
                    "iterative_scan": scan,
                    **percentiles(times, (50, 95)),
                    "recall@10": float(np.mean(recall)),
                }
            )
            print(f"speed {model}: {runs[-1]}")
    figures["ranking"] = runs
    query_texts = [" ".join(words[i][:5]) for i in picks]
    figures["end_to_end"], figures["load_by_mode"] = {}, {}
    figures["documents"], figures["statements"] = {}, {}
    async with Index.open(settings) as index:
        await index.search_chunks(query_texts[0], top_k=10)  # loads the model
        for mode in SEARCH_MODES:
            forget()  # each mode counts its terms' dfs afresh: no mode runs on another's
            figures["load_by_mode"][mode] = os.getloadavg()[0]
            times = []
            with counted_statements(pg, url, figures["statements"], f"{mode} chunks"):
                for text in query_texts:
                    began = time.perf_counter()
                    await index.search_chunks(text, top_k=10, mode=mode)
                    times.append((time.perf_counter() - began) * 1000)
            figures["end_to_end"][mode] = percentiles(times, (50, 95))
            print(f"speed {model} {mode} end to end: {figures['end_to_end'][mode]}")
            # as `trioindex search` and GET /search ask: 5 documents, 3 chunks each
            times = []
            with counted_statements(pg, url, figures["statements"], f"{mode} documents"):
                for text in query_texts:
                    began = time.perf_counter()
                    await index.search(text, mode=mode)
                    times.append((time.perf_counter() - began) * 1000)
            figures["documents"][mode] = percentiles(times, (50, 95))
            # as `search --queries` and POST /search ask: batches of queries
            times = []
            with counted_statements(pg, url, figures["statements"], f"{mode} documents × 10"):
                for at in range(0, len(query_texts), 10):
                    began = time.perf_counter()
                    await index.search_many(query_texts[at : at + 10], mode=mode)
                    times.append((time.perf_counter() - began) * 1000)
            figures.setdefault("batches", {})[mode] = percentiles(times, (50, 95))
            print(
                f"speed {model} {mode} documents end to end: {figures['documents'][mode]};"
                f" 10 at once: {figures['batches'][mode]};"
                f" statements per query: {figures['statements']}"
            )
    return figures


@contextlib.contextmanager
def counted_statements(
    pg: BenchPostgres, url: str, into: dict[str, float], name: str, queries: int = 200
) -> Iterator[None]:
    """Counts the top-level statements (``pg_stat_statements``: every client round trip,
    ``BEGIN`` and ``COMMIT`` included) ``url``'s database runs in the block, per query."""
    pg.reset_statements()
    yield
    into[name] = round(sum(s.calls for s in pg.statements(url)) / queries, 2)


# -- report -----------------------------------------------------------------------------------------


def eval_lines(sets: list[dict[str, Any]]) -> list[str]:
    lines = []
    for f in sets:
        langs = sorted(f["modes"]["vector"])
        n = ", ".join(f"{f['modes']['vector'][lang]['queries']} {lang}" for lang in langs)
        header = ["mode"] + [f"{lang} {m}" for lang in langs for m in ("nDCG@10", "recall@10")]
        rows = [
            [mode, *(f"{v[lang][m]:.3f}" for lang in langs for m in ("ndcg@10", "recall@10"))]
            for mode, v in f["modes"].items()
        ]
        fusion = [
            [params.replace("/", " / "), *(f"{v[lang]['ndcg@10']:.3f}" for lang in langs)]
            for params, v in f["fusion"].items()
        ]
        if "reference" in f:
            ref = f["reference"]
            rows.append(
                [
                    "reference BM25 (bm25s)",
                    *(f"{ref[lang][m]:.3f}" for lang in langs for m in ("ndcg@10", "recall@10")),
                ]
            )
        ratio = (
            [
                "Text against the reference BM25, nDCG@10: "
                + ", ".join(
                    f"{lang} {f['modes']['text'][lang]['ndcg@10'] / r:.3f}×"
                    if (r := f["reference"][lang]["ndcg@10"])
                    else f"{lang} n/a"
                    for lang in langs
                )
                + ".",
                "",
            ]
            if "reference" in f
            else []
        )
        lines += [
            f"## Ranking quality: {f['set']} ({f['documents']} documents, {f['chunks']} chunks;"
            f" queries: {n})",
            "",
            *markdown_table(header, rows),
            "",
            *ratio,
            f"Fusion of the {TUNE_DEPTH}-deep vector and text chunk rankings, nDCG@10 by"
            " k / text weight (vector weight 1):",
            "",
            *markdown_table(["k / text weight", *(f"{lang} nDCG@10" for lang in langs)], fusion),
            "",
        ]
    return lines


def speed_lines(runs: list[dict[str, Any]]) -> list[str]:
    lines = []
    for f in runs:
        rows = [
            [
                str(r["ef_search"]),
                r["iterative_scan"],
                f"{r['p50']:.1f}",
                f"{r['p95']:.1f}",
                f"{r['recall@10']:.3f}",
            ]
            for r in f["ranking"]
        ]
        e2e = [[mode, f"{v['p50']:.1f}", f"{v['p95']:.1f}"] for mode, v in f["end_to_end"].items()]
        vector, hybrid = f["end_to_end"]["vector"], f["end_to_end"]["hybrid"]
        ratio = (
            f"Hybrid against vector, same run: {hybrid['p50'] / vector['p50']:.2f}× at p50,"
            f" {hybrid['p95'] / vector['p95']:.2f}× at p95 (1-minute load average when the"
            f" modes began: {', '.join(f'{m} {v:.1f}' for m, v in f['load_by_mode'].items())})."
        )
        lines += [
            f"## Latency: {f['model']} ({f['dimension']} dimensions), {f['chunks']:,} chunks",
            "",
            f"Load {f['load_s']:.0f} s, HNSW build {f['hnsw_build_s']:.0f} s (m = 16,"
            f" ef_construction = 64: pgvector's defaults); migration 0020 on this table (the"
            f" generated column for every chunk, the GIN index, ANALYZE):"
            f" {f['migration_0020_s']:.0f} s.",
            "",
            "Ranking only (query embedding excluded), top 10 chunks, ms:",
            "",
            *markdown_table(
                ["ef_search", "iterative scan", "p50", "p95", "recall@10 vs exact"], rows
            ),
            "",
            "End to end (`Index.search_chunks`, top 10: serving-model check, query embedding, ranking), ms:",
            "",
            *markdown_table(["mode", "p50", "p95"], e2e),
            "",
            ratio,
            "",
            *document_lines(f),
        ]
    return lines


def document_lines(f: dict[str, Any]) -> list[str]:
    """Document search end to end, and the statements each search costs PostgreSQL."""
    if "documents" not in f:
        return []
    statements = f["statements"]
    rows = [
        [
            mode,
            f"{v['p50']:.1f}",
            f"{v['p95']:.1f}",
            f"{statements[f'{mode} chunks']:.2f}",
            f"{statements[f'{mode} documents']:.2f}",
            f"{statements[f'{mode} documents × 10']:.2f}",
            f"{f['batches'][mode]['p50']:.1f}",
            f"{f['batches'][mode]['p95']:.1f}",
        ]
        for mode, v in f["documents"].items()
    ]
    return [
        "End to end (`Index.search`: 5 documents, 3 chunks each, marked), ms; the"
        " statements PostgreSQL runs per query (`pg_stat_statements`, `BEGIN`/`COMMIT`"
        " included) for `search_chunks`, `search` and `search_many` of 10 queries; and a"
        " `search_many` of 10 queries end to end, ms:",
        "",
        *markdown_table(
            [
                "mode",
                "p50",
                "p95",
                "statements: chunks",
                "documents",
                "documents × 10",
                "10 queries: p50",
                "p95",
            ],
            rows,
        ),
        "",
    ]


def write_section(name: str, head: list[str], body: list[str]) -> None:
    """Replace this run's section of docs/test-results/search.md (eval and speed run apart)."""
    old = REPORT.read_text() if REPORT.exists() else "# Search: quality and speed\n"
    begin, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    section = "\n".join([begin, *head[1:], *body, end])
    if begin in old:
        old = old[: old.index(begin)] + section + old[old.index(end) + len(end) :]
    else:
        old = old.rstrip("\n") + "\n\n" + section + "\n"
    REPORT.write_text(old)
    print(f"wrote {REPORT}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["eval", "speed"])
    parser.add_argument("--quick", action="store_true", help="a small run; nothing is written")
    parser.add_argument("--progit", help="a clone of github.com/progit/progit2 (eval)")
    parser.add_argument("--progit-ko", help="a clone of github.com/progit/progit2-ko (eval)")
    parser.add_argument("--rerank-url", help="a TEI /rerank server: also rank hybrid re-ranked")
    parser.add_argument(
        "--model",
        action="append",
        choices=[name for name, _ in SPEED_MODELS],
        help="speed: only this model (repeatable; both when not given)",
    )
    args = parser.parse_args()
    began, figures = time.monotonic(), []
    models = [(name, dim) for name, dim in SPEED_MODELS if not args.model or name in args.model]
    if args.what == "eval":
        sets = [known_items(40 if args.quick else 120), progit(args.progit, args.progit_ko)]
        if sets[1] is None:
            print("eval: the progit set is skipped (no --progit / --progit-ko clones given)")
        for labelled in filter(None, sets):
            with (
                BenchPostgres() as pg,
                pg.fresh_database("search") as url,
                tempfile.TemporaryDirectory() as home,
            ):
                run = functools.partial(evaluate, rerank_url=args.rerank_url)
                figures.append(trio.run(run, url, Path(home), labelled))
                machine = machine_info(url)
    else:
        for model, dim in models:
            with (
                BenchPostgres() as pg,
                pg.fresh_database("search") as url,
                tempfile.TemporaryDirectory() as home,
                FakeEmbedServer() as server,
            ):
                chunks, served = (
                    5_000 if args.quick else 100_000,
                    None if dim == 384 else server.url,
                )
                run = functools.partial(speed, pg, chunks=chunks, server_url=served)
                figures.append(trio.run(run, url, Path(home), model, dim))
                machine = machine_info(url)
    body = eval_lines(figures) if args.what == "eval" else speed_lines(figures)
    command = (
        f".venv/bin/python -m bench.search {args.what}"
        + (" --quick" if args.quick else "")
        + "".join(f" --model {name}" for name in args.model or ())
    )
    head = page_head(f"search {args.what}", utc_now(), command, time.monotonic() - began, machine)
    if args.quick:
        print("\n".join(body))
    else:
        write_section(args.what, head, body)


if __name__ == "__main__":
    main()
