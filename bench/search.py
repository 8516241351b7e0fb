"""Search: ranking quality per mode (`just eval`) and latency over 100k chunks (`speed`).

**eval** — a labelled known-item set built from texts installed on this machine, in English
and Korean: each manual page (`/usr/share/man/man1`, a fixed sample, and every Korean page
under `/usr/share/man/ko`) is a document without its NAME line, and the NAME line's
description ("print lines that match patterns") is the query whose one relevant document is
that page; each lesson of the Vim tutor (English and Korean) is a document without its title,
and the title is the query. The documents are chunked by the production chunker (the local
model's tokenizer, the default size and overlap), embedded by the local model
(all-MiniLM-L6-v2, offline) and stored as a worker stores them; every query then runs through
`Index.search_many` in each mode (documents, top 10). nDCG@10 (one relevant document: 1 /
log2(1 + rank)) and recall@10 are averaged per language.

**speed** — 100k chunks (10k documents × 10) with clustered unit vectors (2,000 Gaussian
clusters, so the HNSW graph sees structure like real embeddings) and text drawn from the
manual pages' vocabulary, for the local model's 384 dimensions and a server model's 1024
(bge-m3's size, served by testkit's fake TEI server over HTTP). 200 queries, one at a time:
a stored chunk's vector plus noise, and five of its words. Query embedding excluded: the
ranking call alone (`vector_ranking`, top 10 chunks) for each `ef_search` and iterative-scan
setting, with recall@10 against exact (brute-force) search; included: `Index.search_chunks`
end to end (serving-model check, query embedding, ranking) per mode.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import math
import re
import tempfile
import time
from collections.abc import Sequence
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
from testkit.embed_server import FakeEmbedServer
from testkit.search_corpus import IndexedDocument, store_indexed
from trioindex.api import Index
from trioindex.config import load_settings
from trioindex.db.models import ensure_model
from trioindex.db.pool import connect
from trioindex.search import SEARCH_MODES, HnswSettings, vector_ranking
from trioindex.services import open_configured_embedder
from trioindex.worker.wiring import build_chunker

MAN = Path("/usr/share/man")
TUTOR = Path("/usr/share/vim/vim90/tutor")
REPORT = RESULTS_DIR / "search.md"

# -- the labelled corpus --------------------------------------------------------------------------


def roff_text(source: str) -> tuple[str, str]:
    """A manual page's NAME description and the rest as plain text (good enough for search)."""
    description, lines, section = "", [], ""
    for line in source.splitlines():
        if line.startswith(('.\\"', "'\\\"")):
            continue
        if line.startswith(".SH"):
            section = line[3:].strip().strip('"')
            lines += ["", section, ""]
            continue
        text = re.sub(r"\\f(\[[^]]*\]|\(..|.)|\\&|\\[cd]", "", line)
        text = text.replace("\\-", "-").replace("\\ ", " ").replace("\\(em", "—")
        if text.startswith("."):
            text = text.split(" ", 1)[1] if " " in text else ""
        if section in ("NAME", "이름") and not description and " - " in text:
            description = text.split(" - ", 1)[1].strip()
            continue
        lines.append(text)
    return description, re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def man_pages(folders: Sequence[Path], take: int, lang: str) -> list[tuple[str, str, str, str]]:
    """``(key, text, query, language)`` per page with a description of 3+ words."""
    found = []
    for path in sorted(p for f in folders for p in f.glob("*.gz")):
        source = gzip.decompress(path.read_bytes()).decode("utf-8", "replace")
        if source.lstrip().startswith(".so"):
            continue
        query, text = roff_text(source)
        if len(query.split()) >= 3 and 1000 <= len(text) <= 20_000:
            found.append((f"man/{lang}/{path.name[:-3]}", text, query, lang))
    step = max(1, len(found) // take)
    return found[::step][:take]


def tutor_lessons(path: Path, lang: str) -> list[tuple[str, str, str, str]]:
    text = path.read_text(encoding="utf-8", errors="replace")
    parts = re.split(r"^\s*Lesson (\d+\.\d+(?:\.\d+)?):\s*(.+)$", text, flags=re.M)
    return [
        (f"tutor/{lang}/{num}", body.strip("~ \n"), title.strip(), lang)
        for num, title, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True)
        if len(title.split()) >= 2 or lang == "ko"
    ]


def labelled_corpus(english_pages: int) -> list[tuple[str, str, str, str]]:
    return (
        man_pages([MAN / "man1"], english_pages, "en")
        + man_pages(sorted((MAN / "ko").glob("man*")), 1000, "ko")
        + tutor_lessons(TUTOR / "tutor", "en")
        + tutor_lessons(TUTOR / "tutor.ko.utf-8", "ko")
    )


async def evaluate(url: str, home: Path, english_pages: int) -> dict[str, Any]:
    settings = load_settings(environ={"TRIOINDEX_DATABASE_URL": url, "TRIOINDEX_HOME": str(home)})
    corpus = labelled_corpus(english_pages)
    embedder = await open_configured_embedder(settings)
    chunker = build_chunker(settings, embedder)
    started = time.monotonic()
    chunked = [await trio.to_thread.run_sync(chunker.chunk, text) for _, text, _, _ in corpus]
    texts = [c.text for chunks in chunked for c in chunks]
    vectors = iter(await embedder.embed(texts))
    await embedder.aclose()
    print(
        f"eval: {len(corpus)} documents, {len(texts)} chunks embedded in {time.monotonic() - started:.0f}s"
    )
    figures: dict[str, Any] = {"documents": len(corpus), "chunks": len(texts), "modes": {}}
    async with Index.open(settings) as index:
        docs = [
            IndexedDocument(key, [c.text for c in chunks], [next(vectors) for _ in chunks])
            for (key, *_), chunks in zip(corpus, chunked, strict=True)
        ]
        with connect(url) as conn:
            store_indexed(conn, index.model, docs)
        for mode in SEARCH_MODES:
            answers = await index.search_many(
                [q for *_, q, _ in corpus], mode=mode, top_k=10, chunks_per_document=1
            )
            scores: dict[str, list[tuple[float, float]]] = {"en": [], "ko": []}
            for (key, _, _, lang), hits in zip(corpus, answers, strict=True):
                rank = next((h.rank for h in hits if h.document_key == key), None)
                scores[lang].append((1 / math.log2(1 + rank), 1.0) if rank else (0.0, 0.0))
            figures["modes"][mode] = {
                lang: {
                    "queries": len(s),
                    "ndcg@10": float(np.mean([n for n, _ in s])),
                    "recall@10": float(np.mean([r for _, r in s])),
                }
                for lang, s in scores.items()
            }
            print(f"eval {mode}: {figures['modes'][mode]}")
    return figures


# -- speed ------------------------------------------------------------------------------------------


def clustered(n: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    centres = rng.standard_normal((2000, dim))
    v = centres[rng.integers(0, 2000, n)] + 0.35 * rng.standard_normal((n, dim))
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[float, Any]:
    began = time.perf_counter()
    result = fn(*args, **kwargs)
    return (time.perf_counter() - began) * 1000, result


async def speed(
    url: str, home: Path, model: str, dim: int, *, chunks: int, server_url: str | None
) -> dict[str, Any]:
    env = {"TRIOINDEX_DATABASE_URL": url, "TRIOINDEX_HOME": str(home), "TRIOINDEX_EMBEDDING_MODEL": model,
           "TRIOINDEX_EMBEDDING_DIMENSION": str(dim)}  # fmt: skip
    if server_url:
        env |= {"TRIOINDEX_EMBEDDING_API": "tei", "TRIOINDEX_EMBEDDING_URL": server_url}
    settings = load_settings(environ=env)
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
    texts = [" ".join(row) for row in words]
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
            f"""CREATE INDEX {registered.index_name} ON embeddings
            USING hnsw ((vector::vector({dim})) vector_cosine_ops) WHERE embedding_model_id = '{registered.id}'""",
        )
        # what migration 0007 costs on a table this size: the column computed for every row
        conn.execute("ALTER TABLE document_chunks DROP COLUMN search_vector")
        sql = resources.files("trioindex.db.migrations").joinpath("0007_chunk_full_text.sql")
        rewrite_ms, _ = timed(conn.execute, sql.read_text())
        conn.execute("VACUUM ANALYZE")
        figures |= {"load_s": load_ms / 1000, "hnsw_build_s": index_ms / 1000}
        figures["migration_0007_s"] = rewrite_ms / 1000
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
    figures["end_to_end"] = {}
    async with Index.open(settings) as index:
        await index.search_chunks(query_texts[0], top_k=10)  # loads the model
        for mode in SEARCH_MODES:
            times = []
            for text in query_texts:
                began = time.perf_counter()
                await index.search_chunks(text, top_k=10, mode=mode)
                times.append((time.perf_counter() - began) * 1000)
            figures["end_to_end"][mode] = percentiles(times, (50, 95))
            print(f"speed {model} {mode} end to end: {figures['end_to_end'][mode]}")
    return figures


# -- report -----------------------------------------------------------------------------------------


def eval_lines(f: dict[str, Any]) -> list[str]:
    rows = [
        [
            mode,
            *(
                f"{f['modes'][mode][lang][m]:.3f}"
                for lang in ("en", "ko")
                for m in ("ndcg@10", "recall@10")
            ),
        ]
        for mode in SEARCH_MODES
    ]
    n = {lang: f["modes"]["vector"][lang]["queries"] for lang in ("en", "ko")}
    return [
        f"## Ranking quality ({f['documents']} documents, {f['chunks']} chunks; {n['en']} English and {n['ko']} Korean queries)",
        "",
        *markdown_table(["mode", "en nDCG@10", "en recall@10", "ko nDCG@10", "ko recall@10"], rows),
        "",
    ]


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
        lines += [
            f"## Latency: {f['model']} ({f['dimension']} dimensions), {f['chunks']:,} chunks",
            "",
            f"Load {f['load_s']:.0f} s, HNSW build {f['hnsw_build_s']:.0f} s (m = 16,"
            f" ef_construction = 64: pgvector's defaults); migration 0007 on this table (the"
            f" generated column for every chunk + the GIN index): {f['migration_0007_s']:.0f} s.",
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
        ]
    return lines


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
    args = parser.parse_args()
    began, figures = time.monotonic(), []
    models = [("sentence-transformers/all-MiniLM-L6-v2", 384), ("BAAI/bge-m3", 1024)]
    for model, dim in models[: 1 if args.what == "eval" else 2]:
        with (
            BenchPostgres() as pg,
            pg.fresh_database("search") as url,
            tempfile.TemporaryDirectory() as home,
            FakeEmbedServer() as server,
        ):
            if args.what == "eval":
                figures.append(trio.run(evaluate, url, Path(home), 40 if args.quick else 120))
            else:
                chunks, served = (
                    5_000 if args.quick else 100_000,
                    None if dim == 384 else server.url,
                )
                run = functools.partial(speed, chunks=chunks, server_url=served)
                figures.append(trio.run(run, url, Path(home), model, dim))
            machine = machine_info(url)
    body = eval_lines(figures[0]) if args.what == "eval" else speed_lines(figures)
    command = f".venv/bin/python -m bench.search {args.what}" + (" --quick" if args.quick else "")
    head = page_head(f"search {args.what}", utc_now(), command, time.monotonic() - began, machine)
    if args.quick:
        print("\n".join(body))
    else:
        write_section(args.what, head, body)


if __name__ == "__main__":
    main()
