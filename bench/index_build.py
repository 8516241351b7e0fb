"""The first vector-index build of a model, by phase: what ``worker --drain`` spends after the
queue is drained.

A fresh database of one embedded PostgreSQL 18 + pgvector gets ``--n`` (20,000) vectors of
``--dim`` (768) dimensions stored as one model's vectors in trioindex's own ``embeddings``
table (``bench.index_store``'s loader: one document, one chunk per vector), like the peer
benchmark's drain leaves them: ``--data random`` draws them as the peer benchmark's mock does
(seeded standard normal), ``clustered`` around 1,000 centres (``bench.index_scale``),
``real`` the local model's cached vectors of real text (``bench.index_corpus``: 384
dimensions, whatever ``--dim`` says). Then
the model's default index (:func:`~trioindex.db.vector_index.create_index_sql`: HNSW over the
sign bits) is built in each *form* asked for (``--forms``), dropped after each, the forms taking
turns ``--rounds`` times:

* ``keeper``: :func:`~trioindex.db.vector_index.build_vector_index`, what the keeper runs;
* ``concurrent``: ``CREATE INDEX CONCURRENTLY`` with the keeper's session settings;
* ``plain``: ``CREATE INDEX`` (a SHARE lock on the table: writers wait);
* ``serial``: ``concurrent`` without parallel workers (``max_parallel_maintenance_workers``
  0), ``one`` with one; ``mem``: ``concurrent`` with ``maintenance_work_mem`` 512 MB;
  ``efN``: ``concurrent`` with ef_construction N (what a thinner build would save; recall is
  ``bench.index_scale``'s to check).

A second connection samples ``pg_stat_progress_create_index`` every 50 ms (the phase, the
building backend's CPU from ``/proc``, the parallel workers it leads): each phase's seconds and
the backend's CPU in it; the parallel workers' CPU is the server's reaped children's over the
build (the workers exit with it; autovacuum is off for the table). Prints one table.

Run ``.venv/bin/python -m bench.index_build`` (nothing is written; the figures go into
docs/test-results/peer.md by hand).
"""

from __future__ import annotations

import argparse
import re
import threading
import time
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import psutil  # type: ignore[import-untyped]
import psycopg

from bench.common import BenchPostgres, format_machine, machine_info
from bench.index_scale import clustered
from bench.index_store import MODEL, Version, add_chunks, copy_embeddings
from testkit.jobs import enqueue_text
from trioindex.db.models import EmbeddingModel, ensure_model
from trioindex.db.pool import connect
from trioindex.db.vector_index import (
    build_vector_index,
    create_index_sql,
    hnsw_parameters,
    quantized_sql,
)

SAMPLE_EVERY = 0.05
LATE_BATCH = 32
FORMS = ("keeper", "concurrent", "plain", "serial", "one", "mem")


def random_vectors(n: int, dim: int, seed: int = 28) -> np.ndarray[Any, np.dtype[np.float32]]:
    """Seeded standard-normal vectors, as the peer benchmark's mock answers (no structure)."""
    return np.random.default_rng(seed).standard_normal((n, dim), dtype=np.float32)


def load(url: str, vectors: np.ndarray[Any, np.dtype[np.float32]], late: int) -> EmbeddingModel:
    """The model with ``vectors`` stored as one document's chunks, no index at the end. The last
    ``late`` of them are stored after the model's index was built over the others, in COPYs of
    :data:`LATE_BATCH` (a worker's group), and the backend's CPU per late vector is printed
    next to the build's CPU per vector: what a vector stored after a build starts costs."""
    early = len(vectors) - late
    with connect(url) as conn:
        model = ensure_model(conn, MODEL, int(vectors.shape[1]))
        doc = enqueue_text(conn, model.id, "base", b"base")
        version = Version(doc.document_id, doc.version_id)
        with conn.transaction():
            for start in range(0, early, 5000):
                part = vectors[start : min(start + 5000, early)]
                ids = add_chunks(conn, version, start, len(part))
                copy_embeddings(conn, model, version, ids, part)
        conn.execute("ALTER TABLE embeddings SET (autovacuum_enabled = false)")
        conn.execute("VACUUM ANALYZE embeddings")
        if late:
            conn.execute(create_index_sql(conn, model))
            row = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()
            assert row is not None
            process = psutil.Process(int(row["pid"]))
            before = _cpu(process)
            for start in range(early, len(vectors), LATE_BATCH):
                part = vectors[start : start + LATE_BATCH]
                with conn.transaction():
                    ids = add_chunks(conn, version, start, len(part))
                    copy_embeddings(conn, model, version, ids, part)
            spent = _cpu(process) - before
            print(
                f"{late} vectors stored into the index over {early}: backend CPU"
                f" {1000 * spent / late:.2f} ms per vector (rows and graph)"
            )
            conn.execute(f"DROP INDEX {model.index_name}")
            conn.execute("VACUUM ANALYZE embeddings")
    return model


@attrs.define
class Sampler:
    """Samples one backend's index build every :data:`SAMPLE_EVERY` seconds in a thread."""

    url: str
    pid: int
    phases: dict[str, list[float]] = attrs.Factory(dict)  # phase -> [seconds, backend CPU s]
    workers: int = 0  # most parallel workers seen at once
    _stop: threading.Event = attrs.Factory(threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        process = psutil.Process(self.pid)
        with psycopg.connect(self.url, autocommit=True) as conn:
            last_t, last_cpu, last_phase = time.monotonic(), _cpu(process), "before"
            while not self._stop.is_set():
                time.sleep(SAMPLE_EVERY)
                row = conn.execute(
                    """SELECT (SELECT phase FROM pg_stat_progress_create_index WHERE pid = %(p)s),
                              (SELECT count(*) FROM pg_stat_activity WHERE leader_pid = %(p)s
                                                                    AND pid <> %(p)s)""",
                    {"p": self.pid},
                ).fetchone()
                now, cpu = time.monotonic(), _cpu(process)
                spent = self.phases.setdefault(last_phase, [0.0, 0.0])
                spent[0] += now - last_t
                spent[1] += cpu - last_cpu
                phase = row[0] if row and row[0] else "after"
                self.workers = max(self.workers, int(row[1]) if row else 0)
                last_t, last_cpu, last_phase = now, cpu, phase


def _cpu(process: psutil.Process) -> float:
    try:
        times = process.cpu_times()
    except psutil.Error:
        return 0.0
    return float(times.user + times.system)


def build_once(pg: BenchPostgres, url: str, model: EmbeddingModel, form: str) -> dict[str, Any]:
    """One build of the model's index in ``form``, then its drop; the figures."""
    with connect(url) as conn:
        row = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()
        assert row is not None
        pid = int(row["pid"])
        conn.execute("SET min_parallel_table_scan_size = 0")
        if form in ("serial", "one"):
            conn.execute(f"SET max_parallel_maintenance_workers = {int(form == 'one')}")
        if form == "mem":
            conn.execute("SET maintenance_work_mem = '512MB'")
        sampler = Sampler(url, pid)
        server_before, backend_before = pg.server_cpu_seconds(), _cpu(psutil.Process(pid))
        sampler.start()
        began = time.monotonic()
        if form == "keeper":
            if not build_vector_index(conn, model, min_vectors=1):
                raise RuntimeError("the keeper built nothing")
        elif form.startswith("ef"):
            _, ef_construction = hnsw_parameters(model.dimension)
            conn.execute(
                create_index_sql(conn, model).replace(
                    f"ef_construction = {ef_construction}", f"ef_construction = {int(form[2:])}"
                )
            )
        else:
            conn.execute(create_index_sql(conn, model, concurrently=form != "plain"))
        seconds = time.monotonic() - began
        time.sleep(2 * SAMPLE_EVERY)
        sampler.stop()
        backend = _cpu(psutil.Process(pid)) - backend_before
        workers_cpu = pg.server_cpu_seconds() - server_before
        conn.execute(f"DROP INDEX {model.index_name}")
    sampler.phases.pop("before", None)
    sampler.phases.pop("after", None)
    return {
        "form": form,
        "seconds": seconds,
        "backend_cpu_s": backend,
        "workers_cpu_s": workers_cpu,
        "workers": sampler.workers,
        "phases": {k: [round(v[0], 3), round(v[1], 3)] for k, v in sampler.phases.items()},
    }


def expression_cpu(url: str, model: EmbeddingModel) -> float:
    """Backend CPU seconds of computing every stored vector's indexed expression (the
    detoasted vector's sign bits) without building anything."""
    with connect(url) as conn:
        row = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()
        assert row is not None
        process = psutil.Process(int(row["pid"]))
        before = _cpu(process)
        conn.execute(
            f"""SELECT count({quantized_sql(conn, model.dimension, "vector")}) FROM embeddings
                WHERE embedding_model_id = %s""",
            (model.id,),
        )
        return _cpu(process) - before


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.index_build", description=__doc__)
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--data", choices=("random", "clustered", "real"), default="random")
    parser.add_argument("--forms", default="keeper,plain,serial,mem")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--late", type=int, default=2000, help="vectors stored after a build")
    args = parser.parse_args(argv)
    forms = [f for f in args.forms.split(",") if f]
    if unknown := {f for f in forms if not (f in FORMS or re.fullmatch(r"ef\d+", f))}:
        parser.error(f"unknown forms: {sorted(unknown)}")
    if args.data == "random":
        vectors = random_vectors(args.n, args.dim)
    elif args.data == "clustered":
        vectors = clustered(args.n, extra=0, dimension=args.dim).base
    else:
        from bench.index_corpus import real_vectors

        vectors = real_vectors(args.n).astype(np.float32)
    with BenchPostgres() as pg, pg.fresh_database("index_build") as url:
        print("\n".join(format_machine(machine_info(url))))
        model = load(url, vectors, args.late)
        print(f"{args.n} {args.data} vectors of {model.dimension} dimensions loaded")
        for _ in range(2):
            print(f"the indexed expression alone: {expression_cpu(url, model):.2f} s backend CPU")
        for round_ in range(1, args.rounds + 1):
            for form in forms:
                r = build_once(pg, url, model, form)
                phases = "; ".join(
                    f"{name} {s:.2f} s / {cpu:.2f} cpu" for name, (s, cpu) in r["phases"].items()
                )
                print(
                    f"round {round_} {form:10} {r['seconds']:.2f} s, backend CPU"
                    f" {r['backend_cpu_s']:.2f} s, workers {r['workers']} CPU"
                    f" {r['workers_cpu_s']:.2f} s | {phases}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
