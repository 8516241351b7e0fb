"""What a small document costs the worker's main thread, function by function, in isolation.

The per-job work a lone worker does on its Trio thread for a small plain-text document, outside
the database and HTTP: ``detect_format`` (the parse step asks first, to parse small text
inline), ``parse_document`` (sha256 check, ``extract_text``, ``Chunker.chunk``), the chunk ids
(``ChunkCommit``), ``drafts_from_matrix`` for its one vector, and ``JobRunner._record`` (the
job's INFO line through the worker's buffered log handler, to /dev/null, and its metrics). Each
is timed with ``time.thread_time`` over ``--calls`` calls, the best of ``--inner`` repeats in one
interpreter (other work only ever adds time), on two documents: the fleet benchmark's
(``bench.fleet.write_documents``: one sentence) and a 600-character English text (the peer
benchmark's size, ``bench.harness.chunk_texts``), both chunked as the fleet's worker chunks them
(1,500 characters, overlap 150, a TEI server's input limit of 8,192 tokens).

``--baseline-tree DIR`` runs the same measurement on another source tree (its ``src`` on
``PYTHONPATH``; main's from ``git archive main | tar -x -C DIR``) in a fresh interpreter,
``--rounds`` rounds interleaved with this tree's. Run
``.venv/bin/python -m bench.small_doc [--baseline-tree DIR]``; it prints the machine, the load,
µs per call for each tree and the ratio, and writes nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import time
import types
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import add_tree_options, compared_trees, machine_info, run_child_in_tree

DIMENSION = 1024  # the fleet's fake TEI embedder (BAAI/bge-m3 shape)
STEPS = ("detect", "parse", "ids", "drafts", "record")


def documents() -> dict[str, tuple[str, bytes]]:
    """The documents measured: name -> (file name, bytes)."""
    from bench.harness import chunk_texts

    fleet = "Document 17 of the fleet benchmark. It is short: one chunk, one vector.\n"
    english = chunk_texts(1, characters=600, salt="peer")[0]
    return {
        "fleet": ("doc-00017.txt", fleet.encode()),
        "600 chars": ("doc-00000.txt", english.encode()),
    }


def _best(work: Callable[[], object], calls: int, inner: int) -> float:
    """µs of thread CPU per call: the best of ``inner`` runs of ``calls`` calls."""
    for _ in range(min(calls, 200)):
        work()
    best = float("inf")
    for _ in range(inner):
        began = time.thread_time()
        for _ in range(calls):
            work()
        best = min(best, (time.thread_time() - began) / calls * 1e6)
    return best


def child(calls: int, inner: int) -> dict[str, Any]:
    """µs per call of each step on each document, with this interpreter's trioindex."""
    import numpy as np

    import trioindex
    from trioindex.db.steps import ChunkCommit, ChunkRef, EmbedSnapshot
    from trioindex.logs import configure_logging
    from trioindex.pipeline.chunk_values import ChunkingPolicy
    from trioindex.pipeline.chunking import Chunker
    from trioindex.pipeline.embed_step import drafts_from_matrix
    from trioindex.pipeline.formats import detect_format
    from trioindex.pipeline.parse_process import ParseRequest, parse_document
    from trioindex.values import Claim, ParseSnapshot
    from trioindex.worker.counters import WorkerCounters
    from trioindex.worker.job import SUCCEEDED, JobContext, JobRunner

    # the worker's log handler (buffered, text), writing to /dev/null
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115  (for the life of this child)
    configure_logging("text", logging.INFO, buffered=True)
    chunker = Chunker(ChunkingPolicy(1500, 150, 8192))
    now = datetime.now(UTC)
    results: dict[str, Any] = {"trioindex": str(Path(trioindex.__file__).parent)}
    for label, (name, data) in documents().items():
        snapshot = ParseSnapshot(
            uuid.uuid4(), uuid.uuid4(), "objects/x", name, None, len(data),
            hashlib.sha256(data).hexdigest(), now,
        )  # fmt: skip
        claim = Claim(
            uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4(),
            1, now, name, parse=snapshot,
        )  # fmt: skip
        detected = detect_format(data, name, None)
        request = ParseRequest(
            data, snapshot.sha256, name, None, 10 * 1024 * 1024, detected=detected
        )
        chunks = parse_document(request, chunker).chunks
        commit = ChunkCommit(claim, snapshot, chunks)
        embed = EmbedSnapshot(
            snapshot.version_id, snapshot.document_id, claim.embedding_model_id, "BAAI/bge-m3",
            DIMENSION, tuple(ChunkRef(i, c.index, "") for i, c in zip(commit.ids, chunks, strict=True)), False,
        )  # fmt: skip
        matrix = np.random.default_rng(7).standard_normal((len(chunks), DIMENSION), np.float32)
        runner = _runner_stand_in(WorkerCounters())
        context = JobContext(claim, 0.0, None, step="complete", outcome=SUCCEEDED)  # type: ignore[arg-type]
        work: dict[str, Callable[[], object]] = {
            "detect": lambda d=data, n=name: detect_format(d, n, None),  # type: ignore[misc]
            "parse": lambda r=request: parse_document(r, chunker),  # type: ignore[misc]
            "ids": lambda: ChunkCommit(claim, snapshot, chunks),  # noqa: B023
            "drafts": lambda: drafts_from_matrix(embed, matrix),  # noqa: B023
            "record": lambda: JobRunner._record(runner, context, 0.0123),  # noqa: B023
        }
        results[label] = {
            "chunks": len(chunks),
            **{step: _best(work[step], calls, inner) for step in STEPS},
        }
    logging.shutdown()
    return results


def _runner_stand_in(counters: object) -> Any:
    """A stand-in for a ``JobRunner`` with what ``_record`` reads (its counters): the real one
    needs a queue, steps and leases that play no part in recording a job."""
    return types.SimpleNamespace(counters=counters)


def measure(tree: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    """One round in a fresh interpreter (``tree``'s code, or this one's)."""
    out = run_child_in_tree(
        "bench.small_doc", tree, f"--calls={args.calls}", f"--inner={args.inner}"
    )
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--inner", type=int, default=3)
    add_tree_options(parser, rounds=5)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.calls, args.inner)))
        return
    machine = machine_info()
    print(
        f"{machine['cpu']}, {machine['usable_cores']} usable cores, {machine['python']},"
        f" commit {machine['git_commit']}; load {os.getloadavg()[0]:.2f} at the start;"
        f" {args.rounds} rounds x best of {args.inner} x {args.calls} calls"
    )
    trees = compared_trees(args)
    best: dict[str, dict[str, dict[str, float]]] = {}
    loads: list[float] = []
    imported: dict[str, str] = {}
    for _ in range(args.rounds):
        for name, tree in trees:
            result = measure(tree, args)
            best.setdefault(name, {})
            imported[name] = result.pop("trioindex")
            for label, figures in result.items():
                kept = best[name].setdefault(label, {})
                for step in STEPS:
                    kept[step] = min(kept.get(step, float("inf")), figures[step])
        loads.append(os.getloadavg()[0])
    for label in best[trees[0][0]]:
        print(f"\n{label}: µs of main-thread CPU per call (best of all rounds)")
        print(f"  {'step':<8}" + "".join(f"{name:>12}" for name, _ in trees) + "   ratio")
        for step in (*STEPS, "total"):
            row = {
                name: (
                    sum(best[name][label].values()) if step == "total" else best[name][label][step]
                )
                for name, _ in trees
            }
            line = f"  {step:<8}" + "".join(f"{row[name]:>12.2f}" for name, _ in trees)
            if len(trees) == 2:
                line += f"   {row['this tree'] / row['baseline']:.2f}x"
            print(line)
    for name, path in imported.items():
        print(f"{name}: trioindex from {path}")
    print(f"\nload (1 min) after each round: {', '.join(f'{x:.2f}' for x in loads)}")
    print(json.dumps({"machine": machine.get("cpu"), "loads": loads, "best_us": best}))


if __name__ == "__main__":
    main()
