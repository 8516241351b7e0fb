"""What one embedding answer costs the worker, from the parsed JSON to the rows it stores.

An OpenAI-compatible answer of ``--batch`` vectors (25 by default: the peer benchmark's mean
request holds 21-32) of ``--dimension`` (768: pgai's workload) as base64 float32, already
parsed (``json.loads`` costs both trees the same), goes through the tree's own code: the
provider's check (``vectors_by_index`` and ``validate_vectors``, what
``OpenAIEmbedder._embed_batch`` runs after the HTTP round) inside the worker's
``EmbeddingCoalescer``, which hands one caller its float32 matrix. Process CPU per request and
per vector, the best of ``--rounds`` rounds of ``--requests`` requests (other work only ever
adds time).

``--baseline-tree DIR`` runs the same measurement on another source tree (its ``src`` on
``PYTHONPATH``; main's from ``git archive main | tar -x -C DIR``) in the same invocation,
rounds interleaved. Run ``.venv/bin/python -m bench.answer_cost [--baseline-tree DIR]``; it
prints its figures and the machine, and writes nothing.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import add_tree_options, compared_trees, machine_info, run_child_in_tree


def answer_body(batch: int, dimension: int) -> dict[str, Any]:
    """An OpenAI-compatible answer of ``batch`` unit vectors, base64 float32, out of order."""
    rng = np.random.default_rng(7)
    matrix = rng.standard_normal((batch, dimension)).astype("<f4")
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    data = [
        {"object": "embedding", "index": i, "embedding": base64.b64encode(row.tobytes()).decode()}
        for i, row in enumerate(matrix)
    ]
    return {"object": "list", "data": data[::-1]}


def child(batch: int, dimension: int, requests: int) -> float:
    """CPU seconds for ``requests`` answers through this interpreter's trioindex."""
    import trio

    from trioindex.embedding.batching import EmbeddingCoalescer
    from trioindex.embedding.openai import vectors_by_index
    from trioindex.embedding.vectors import validate_vectors

    body = answer_body(batch, dimension)

    async def embed_one(texts: Any) -> Any:
        # what OpenAIEmbedder._embed_batch does with the parsed body
        return validate_vectors(
            vectors_by_index(body, len(texts)),
            expected_count=len(texts),
            dimension=dimension,
            base64_allowed=True,
        )

    texts = [f"chunk {i}" for i in range(batch)]

    async def run() -> float:
        coalescer = EmbeddingCoalescer(
            embed_one=embed_one, max_batch_size=batch, max_in_flight=1, linger=0.0
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(coalescer.serve)
            for _ in range(20):  # warm-up
                await coalescer.embed(texts, dimension)
            began = time.process_time()
            for _ in range(requests):
                matrix = await coalescer.embed(texts, dimension)
            spent = time.process_time() - began
            assert matrix.shape == (batch, dimension) and matrix.dtype == np.float32
            nursery.cancel_scope.cancel()
        return spent

    return trio.run(run)


def measure(tree: Path | None, args: argparse.Namespace) -> float:
    """CPU ms per request of one round in a fresh interpreter (``tree``'s code, or this one's)."""
    out = run_child_in_tree(
        "bench.answer_cost",
        tree,
        f"--batch={args.batch}",
        f"--dimension={args.dimension}",
        f"--requests={args.requests}",
    )
    return float(out.strip()) / args.requests * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=25)
    parser.add_argument("--dimension", type=int, default=768)
    parser.add_argument("--requests", type=int, default=400)
    add_tree_options(parser, rounds=5)
    args = parser.parse_args()
    if args.child:
        print(child(args.batch, args.dimension, args.requests))
        return
    machine = machine_info()
    print(
        f"{machine['cpu']}, load {os.getloadavg()[0]:.1f} at the start; {args.batch} vectors of"
        f" {args.dimension} dimensions per answer, {args.requests} answers x {args.rounds} rounds"
    )
    trees = compared_trees(args)
    if args.baseline_tree is not None:
        print(f"baseline: the code of {args.baseline_tree}")
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, tree in trees:
            ms = measure(tree, args)
            best[name] = min(best.get(name, ms), ms)
    for name, ms in best.items():
        print(f"{name}: {ms:.3f} ms CPU per answer, {ms / args.batch * 1000:.1f} µs per vector")
    if len(best) == 2:
        base, this = best[trees[0][0]], best[trees[1][0]]
        print(
            f"this tree / baseline: {this / base:.2f}x"
            f" ({(base - this) / args.batch:.4f} ms less per vector)"
        )
    print(f"load {os.getloadavg()[0]:.1f} at the end")
    print(json.dumps({"machine": machine.get("cpu"), "best_ms_per_answer": best}))


if __name__ == "__main__":
    main()
