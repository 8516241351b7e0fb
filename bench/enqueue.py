"""How fast an application can enqueue from SQL: ``trioindex_enqueue_documents`` from one
connection, in batches, against the raw rows written set-based.

Each round, in a fresh database with a serving model, ``DOCUMENTS`` new documents are enqueued
from one connection in batches (one call and one commit per batch) two ways, interleaved:

1. **the function** — ``trioindex_enqueue_documents`` (validation, the document lock in key
   order, the same-bytes check, version, job, event, ``NOTIFY``): what ``ingest`` and an
   application call;
2. **raw rows** — the same documents, versions, jobs and events inserted set-based with
   ``unnest`` (no checks, locks or loop): the floor any enqueue path pays for these rows.

It prints documents per second for each and their ratio in the same run, with the batch size
and the machine. Run ``.venv/bin/python -m bench.enqueue``; ``--quick`` for a smoke run.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
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
    plot_panels,
    verdict,
)
from trioindex.db.models import ensure_model
from trioindex.db.pool import connect

DOCUMENTS, QUICK_DOCUMENTS = 20_000, 2_000
BATCHES = (100, 500)
ROUNDS, QUICK_ROUNDS = 3, 1
GOAL_PER_SECOND = 2_000

_RAW = """
WITH input AS (
    SELECT * FROM unnest(%(keys)s::text[], %(storage)s::text[], %(sha)s::text[],
                         %(sizes)s::bigint[]) WITH ORDINALITY AS u(k, s, h, n, o)
), docs AS (
    INSERT INTO documents (external_key) SELECT k FROM input RETURNING id, external_key
), versions AS (
    INSERT INTO document_versions
        (document_id, version_no, storage_key, original_name, content_type, byte_size, sha256)
    SELECT d.id, 1, i.s, i.k, 'text/plain', i.n, i.h
    FROM input i JOIN docs d ON d.external_key = i.k
    RETURNING id, byte_size
), jobs AS (
    INSERT INTO embedding_jobs (document_version_id, embedding_model_id, max_attempts, priority)
    SELECT v.id, %(model)s, 5, 0 FROM versions v RETURNING id, document_version_id
)
INSERT INTO indexing_events (event_type, embedding_job_id, document_version_id, detail)
SELECT 'JOB_ENQUEUED', j.id, v.id, jsonb_build_object('version_no', 1, 'byte_size', v.byte_size)
FROM jobs j JOIN versions v ON v.id = j.document_version_id
"""

_FUNCTION = """SELECT count(*) FROM trioindex_enqueue_documents(
    %(keys)s::text[], %(storage)s::text[], %(sha)s::text[], %(sizes)s::bigint[],
    NULL, NULL, 0, 5, %(model)s)"""


def _batches(count: int, size: int, salt: str) -> list[dict[str, Any]]:
    batches = []
    for start in range(0, count, size):
        keys = [f"{salt}/doc-{i:07d}.txt" for i in range(start, min(count, start + size))]
        shas = [hashlib.sha256(k.encode()).hexdigest() for k in keys]
        batches.append(
            {
                "keys": keys,
                "storage": [f"sha256/{h[:2]}/{h}" for h in shas],
                "sha": shas,
                "sizes": [600] * len(keys),
            }
        )
    return batches


def measure(pg: BenchPostgres, way: str, count: int, batch: int) -> dict[str, Any]:
    with pg.fresh_database("bench_enqueue") as url:
        with connect(url) as conn:
            model = ensure_model(conn, "enqueue-model", 8)
        pg.quiesce(url)
        batches = _batches(count, batch, way)
        sql = _FUNCTION if way == "function" else _RAW
        with psycopg.connect(url) as conn:
            # the session's own server process: its CPU is the steadier cost on a busy machine
            (pid,) = conn.execute("SELECT pg_backend_pid()").fetchone() or (0,)
            backend = psutil.Process(pid)
            cpu_before = sum(backend.cpu_times()[:2])
            began = time.perf_counter()
            for values in batches:
                conn.execute(sql, {**values, "model": model.id})
                conn.commit()
            seconds = time.perf_counter() - began
            server_cpu = sum(backend.cpu_times()[:2]) - cpu_before
            jobs = conn.execute("SELECT count(*) FROM embedding_jobs").fetchone()
        assert jobs == (count,), jobs
    return {"way": way, "batch": batch, "documents": count, "seconds": seconds,
            "per_second": count / seconds,
            "server_cpu_ms_per_doc": server_cpu * 1000 / count}  # fmt: skip


def summary(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for batch in sorted({r["batch"] for r in runs}):
        function = [r["per_second"] for r in runs if r["batch"] == batch and r["way"] == "function"]
        raw = [r["per_second"] for r in runs if r["batch"] == batch and r["way"] == "raw"]
        ratios = [f / r for f, r in zip(function, raw, strict=True)]
        cpu = {
            way: statistics.median(
                r["server_cpu_ms_per_doc"] for r in runs if r["batch"] == batch and r["way"] == way
            )
            for way in ("function", "raw")
        }
        rows.append(
            {
                "batch": batch,
                "function_per_second": statistics.median(function),
                "raw_per_second": statistics.median(raw),
                "ratio": statistics.median(ratios),
                "ratio_range": f"{min(ratios):.2f}-{max(ratios):.2f}",
                "function_cpu_ms_per_doc": cpu["function"],
                "raw_cpu_ms_per_doc": cpu["raw"],
                "goal_met": min(function) >= GOAL_PER_SECOND,
            }
        )
    return rows


def markdown(session: Session, machine: dict[str, Any], rows: list[dict[str, Any]]) -> Any:
    def page(date: str, elapsed: float, png: str) -> str:
        lines = page_head("Enqueue from SQL", date, session.command, elapsed, machine,
                          about=__doc__ or "")  # fmt: skip
        lines += ["## Results", "", f"![enqueue]({png})", "",
                  *markdown_table(
                      ["batch", "function docs/s (median)", "raw rows docs/s (median)",
                       "function ÷ raw (median, range)", "server CPU ms/doc: function / raw",
                       f"≥ {GOAL_PER_SECOND:,}/s"],
                      [[str(r["batch"]), f"{r['function_per_second']:,.0f}",
                        f"{r['raw_per_second']:,.0f}", f"{r['ratio']:.2f} ({r['ratio_range']})",
                        f"{r['function_cpu_ms_per_doc']:.3f} / {r['raw_cpu_ms_per_doc']:.3f}",
                        verdict(r["goal_met"])] for r in rows]),
                  ""]  # fmt: skip
        return "\n".join(lines)

    return page


def main(argv: Sequence[str] | None = None) -> int:
    parser: argparse.ArgumentParser = bench_parser("enqueue", __doc__ or "", "a smoke run")
    add_out(parser, "enqueue")
    args = parser.parse_args(argv)
    session = Session.start("enqueue", args)
    count = QUICK_DOCUMENTS if args.quick else DOCUMENTS
    rounds = QUICK_ROUNDS if args.quick else ROUNDS
    runs = []
    with BenchPostgres() as pg:
        machine = machine_info(pg.admin_url)
        for _ in range(rounds):
            for batch in BATCHES:
                for way in ("function", "raw"):
                    run = measure(pg, way, count, batch)
                    runs.append(run)
                    print(f"{way:<9} batch {batch:>4}: {run['per_second']:,.0f} docs/s,"
                          f" server CPU {run['server_cpu_ms_per_doc']:.3f} ms/doc",
                          flush=True)  # fmt: skip
    rows = summary(runs)
    for row in rows:
        print(f"batch {row['batch']}: function {row['function_per_second']:,.0f} docs/s, "
              f"{row['ratio']:.2f}x raw rows")  # fmt: skip

    def plot(path: Path) -> Path:
        panel = Panel("documents per second, one connection", "docs/s",
                      groups=[str(r["batch"]) for r in rows],
                      bars={"function": [r["function_per_second"] for r in rows],
                            "raw rows": [r["raw_per_second"] for r in rows]})  # fmt: skip
        return plot_panels(path, [panel], (7, 4))

    return session.publish(machine, {"runs": runs, "summary": rows}, plot,
                           markdown(session, machine, rows))  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
