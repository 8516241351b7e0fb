"""Model switch benchmark: does a switch of N documents re-embed at the rate of first indexing?

Each round gets a fresh database of one embedded PostgreSQL, a folder store and the fake TEI
server in a process of its own (a fixed delay per request, so embedding is the bottleneck, as
with a real model server). ``testkit.documents.write_corpus`` files (txt / md / html / docx /
pdf) are ingested for model A and indexed by ``trioindex worker --drain`` configured for A:
**first indexing** (parse, chunk, embed, complete). Then ``trioindex models activate B``
enqueues one job per current version for B, and a worker configured for B drains them: the
**switch** (the stored chunks are embedded again; nothing is parsed). Both phases embed the
same chunks through the same server and worker settings.

Per phase: documents and chunks per second over the active window (first claim → last job
finished, from the jobs' own timestamps), worker CPU ms per document inside that window
(sampled; parse processes not included), PostgreSQL transactions and server CPU per document,
and embedding requests and inputs per document (the server's counters). The switch adds no
per-document overhead when its rate is at least first indexing's and its per-document costs
are no higher. Run ``.venv/bin/python -m bench.switch`` (``just bench-switch``); ``--quick``
is a smoke run that writes its files to a temporary folder unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    BenchPostgres,
    Panel,
    Session,
    add_out,
    bench_parser,
    machine_info,
    markdown_table,
    page_head,
    plot_panels,
    verdict,
)
from bench.harness import RssSampler, folder_env, ingest_folder, log_tail, wait_process
from testkit.documents import write_corpus
from testkit.embed_process import EmbedServerProcess
from testkit.processes import cli, query, spawn

DIMENSION = 256
LATENCY_MS = 50.0  # per request: 32 chunks per 50 ms per connection
CONCURRENCY = 8
COPIES, QUICK_COPIES = 4, 1  # 24 documents per copy
ROUNDS, QUICK_ROUNDS = 2, 1
WORKER_LIMIT_S = 900.0
TARGET = 0.9  # switch rate / first-indexing rate at least this (noise allowance on 2 cores)

_WINDOW_SQL = """
SELECT count(*) AS jobs,
       count(*) FILTER (WHERE j.status <> 'SUCCEEDED') AS unfinished,
       coalesce(sum(v.chunk_count), 0) AS chunks,
       extract(epoch FROM min(a.started_at))::float8 AS first,
       extract(epoch FROM max(j.finished_at))::float8 AS last
FROM embedding_jobs j
JOIN embedding_models m ON m.id = j.embedding_model_id
JOIN document_versions v ON v.id = j.document_version_id
LEFT JOIN embedding_job_attempts a ON a.embedding_job_id = j.id AND a.status = 'SUCCEEDED'
WHERE m.name = %s
"""


def drain(
    pg: BenchPostgres, url: str, env: dict[str, str], server: EmbedServerProcess, logs: Path
) -> dict[str, Any]:
    """One ``worker --drain`` for ``env``'s model over its queued jobs; its figures."""
    model = env["TRIOINDEX_EMBEDDING_MODEL"]
    pg.quiesce(url)
    before = pg.counters(url, settle_seconds=5)
    server.reset_stats()
    log = logs / f"{model}.log"
    worker = spawn(env, "worker", "--drain", log=log)
    with RssSampler(worker.pid, interval=0.2) as sampler:
        if wait_process(worker, WORKER_LIMIT_S, f"worker {worker.pid}") != 0:
            raise RuntimeError(f"worker for {model} failed:\n{log_tail(log)}")
    after = pg.counters(url, settle_seconds=10)
    calls = server.stats()
    row = query(url, _WINDOW_SQL, model)[0]
    if row["unfinished"]:
        why = query(url, "SELECT DISTINCT last_failure_message AS m FROM embedding_jobs"
                         " WHERE status <> 'SUCCEEDED'")  # fmt: skip
        raise RuntimeError(f"{model}: {row['unfinished']} job(s) did not succeed: {why}")
    docs, chunks, active = row["jobs"], int(row["chunks"]), row["last"] - row["first"]
    return {
        "model": model,
        "documents": docs,
        "chunks": chunks,
        "active_s": round(active, 3),
        "documents_per_s": round(docs / active, 2),
        "chunks_per_s": round(chunks / active, 1),
        "worker_cpu_ms_per_document": round(sampler.cpu_between(row["first"], row["last"]) * 1e3 / docs, 1),
        "transactions_per_document": round((after.xact_commit - before.xact_commit) / docs, 2),
        "postgres_cpu_ms_per_document": round((after.server_cpu_s - before.server_cpu_s) * 1e3 / docs, 1),
        "embed_requests_per_document": round(calls["embed_requests"] / docs, 2),
        "inputs_per_document": round(calls["inputs"] / docs, 2),
    }  # fmt: skip


def one_round(pg: BenchPostgres, corpus: Path, work: Path) -> dict[str, Any]:
    """First indexing for model A, then the switch to model B, in one fresh database."""
    with pg.fresh_database("switch") as url, EmbedServerProcess(LATENCY_MS, DIMENSION) as server:
        embedding = {"EMBEDDING_API": "tei", "EMBEDDING_URL": server.url}
        env_a, env_b = (
            folder_env(url, work, CONCURRENCY, EMBEDDING_MODEL=name,
                       EMBEDDING_DIMENSION=str(DIMENSION), **embedding)
            for name in ("model-a", "model-b")
        )  # fmt: skip
        ingest_folder(env_a, corpus)
        first = drain(pg, url, env_a, server, work)
        began = time.monotonic()
        activated = cli(env_a, "models", "activate", "model-b", "--dimension", str(DIMENSION))
        if activated.returncode != 0:
            raise RuntimeError(f"models activate failed: {activated.stderr}")
        activate_s = time.monotonic() - began
        switch = drain(pg, url, env_b, server, work)
        listed = cli(env_a, "models", "list", "--json")  # a complete switch takes effect here
        if listed.returncode != 0:
            raise RuntimeError(f"models list failed: {listed.stderr}")
        serving = query(url, "SELECT name FROM embedding_models WHERE is_active")
    return {
        "first_indexing": first,
        "switch": {**switch, "activate_command_s": round(activate_s, 2)},
        "serving_after": [r["name"] for r in serving],
        "rate_ratio": round(switch["chunks_per_s"] / first["chunks_per_s"], 3),
    }


_ROWS = (
    ("documents", "documents"),
    ("chunks", "chunks"),
    ("active window, s", "active_s"),
    ("documents/s", "documents_per_s"),
    ("chunks/s", "chunks_per_s"),
    ("worker CPU ms/doc", "worker_cpu_ms_per_document"),
    ("PostgreSQL transactions/doc", "transactions_per_document"),
    ("PostgreSQL CPU ms/doc", "postgres_cpu_ms_per_document"),
    ("embedding requests/doc", "embed_requests_per_document"),
    ("embedding inputs/doc", "inputs_per_document"),
)


def markdown(session: Session, machine: dict[str, Any], rounds: list[dict[str, Any]]) -> Any:
    def page(date: str, elapsed: float, png: str) -> str:
        lines = page_head("Model switch benchmark", date, session.command, elapsed, machine,
                          about=__doc__ or "")  # fmt: skip
        lines += ["## Results", "", f"![switch]({png})", ""]
        for i, r in enumerate(rounds, 1):
            first, switch = r["first_indexing"], r["switch"]
            cols = ["", "first indexing (model A)", "switch (model B)", "switch / first"]
            rows = [
                [label, str(first[k]), str(switch[k]),
                 f"{switch[k] / first[k]:.2f}" if first[k] else "-"]
                for label, k in _ROWS
            ]  # fmt: skip
            lines += [f"### Round {i}", "", *markdown_table(cols, rows), ""]
            lines += [f"`models activate` took {switch['activate_command_s']} s (the command, "
                      f"start-up included); serving after the switch (and `models list`): "
                      f"{', '.join(r['serving_after'])}.", ""]  # fmt: skip
        ratios = [r["rate_ratio"] for r in rounds]
        met = min(ratios) >= TARGET
        costs = ", ".join(
            f"{label} {max(r['switch'][k] / r['first_indexing'][k] for r in rounds):.2f}"
            for label, k in _ROWS[5:9]
        )
        lines += ["## Reading", "",
                  f"Switch rate / first-indexing rate (chunks per second): "
                  f"{', '.join(f'{x:.2f}' for x in ratios)}; target ≥ {TARGET}: {verdict(met)}. "
                  f"Per-document costs, switch / first, worst round: {costs}. A switch job "
                  "claims, embeds the stored chunks and completes like a first-indexing job, "
                  "without the storage read and the parse (in parse processes, whose CPU the "
                  "worker figure leaves out). "
                  f"Server: {LATENCY_MS:.0f} ms per request, {DIMENSION} dimensions; "
                  f"worker max-concurrency {CONCURRENCY}.", ""]  # fmt: skip
        return "\n".join(lines)

    return page


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser("switch", "A model switch against first indexing.", "one small round")
    add_out(parser, "switch")
    args: argparse.Namespace = parser.parse_args(argv)
    session = Session.start("switch", args)
    work = Path(tempfile.mkdtemp(prefix="trioindex-bench-switch-"))
    corpus = work / "corpus"
    write_corpus(corpus, copies=QUICK_COPIES if args.quick else COPIES, sentences=20)
    rounds: list[dict[str, Any]] = []
    with BenchPostgres() as pg:
        machine = machine_info(pg.admin_url)
        for i in range(QUICK_ROUNDS if args.quick else ROUNDS):
            round_dir = work / f"round-{i}"
            os.makedirs(round_dir)
            rounds.append(one_round(pg, corpus, round_dir))
            r = rounds[-1]
            print(f"round {i + 1}: first {r['first_indexing']['chunks_per_s']} chunks/s, "
                  f"switch {r['switch']['chunks_per_s']} chunks/s, ratio {r['rate_ratio']}")  # fmt: skip

    def plot(path: Path) -> Path:
        groups = [f"round {i + 1}" for i in range(len(rounds))]
        bars: dict[str, Sequence[float]] = {
            phase: [r[key]["chunks_per_s"] for r in rounds]
            for phase, key in (("first indexing", "first_indexing"), ("switch", "switch"))
        }
        return plot_panels(path, [Panel("Chunks embedded per second", "chunks/s",
                                        groups=groups, bars=bars)], (6, 4))  # fmt: skip

    figures = {"latency_ms": LATENCY_MS, "dimension": DIMENSION, "rounds": rounds}
    return session.publish(machine, figures, plot, markdown(session, machine, rounds))


if __name__ == "__main__":
    raise SystemExit(main())
