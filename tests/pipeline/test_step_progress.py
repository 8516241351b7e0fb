"""Progress lines of a long embed step (pipeline/step_progress.py) through the worker's
embedding coalescer over an in-memory embedder, on Trio's virtual clock."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Sequence

import pytest
import trio
import trio.testing

from trioindex.embedding.batching import EmbeddingCoalescer
from trioindex.embedding.vectors import Vectors, validate_vectors
from trioindex.pipeline.step_progress import StepProgress

BATCH_SECONDS = 4.0


async def slow_embedder(texts: Sequence[str]) -> Vectors:
    await trio.sleep(BATCH_SECONDS)
    vectors = [[float(len(t)), 1.0, 0.5] for t in texts]
    return validate_vectors(vectors, expected_count=len(texts), dimension=3)


async def embed_with_progress(count: int, job_id: uuid.UUID, every: float) -> StepProgress:
    coalescer = EmbeddingCoalescer(
        embed_one=slow_embedder, max_batch_size=4, max_in_flight=1, linger=0.005
    )
    texts = [f"private chunk text {n}" for n in range(count)]
    progress = StepProgress(job_id, len(texts), every=every)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coalescer.serve)
        matrix = await coalescer.embed(texts, 3, release=True, on_arrived=progress.add)
        nursery.cancel_scope.cancel()
    assert matrix.shape == (count, 3)
    return progress


async def test_a_long_embed_step_logs_its_progress_every_few_seconds(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trioindex.pipeline.step_progress")
    job_id = uuid.uuid4()
    # 40 chunks, 4 per batch, one batch at a time, 4 s each: 40 s in all
    progress = await embed_with_progress(40, job_id, every=15.0)
    assert progress.done == 40
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"job {job_id}: 16 of 40 chunks embedded (16 s)",
        f"job {job_id}: 32 of 40 chunks embedded (32 s)",
    ]
    assert not any("private" in line for line in lines)  # never the chunk text


async def test_a_step_shorter_than_the_interval_logs_nothing(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trioindex.pipeline.step_progress")
    progress = await embed_with_progress(12, uuid.uuid4(), every=15.0)
    assert progress.done == 12 and caplog.records == []


async def test_the_interval_is_counted_from_the_last_line(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trioindex.pipeline.step_progress")
    progress = StepProgress(uuid.uuid4(), 100, every=10.0)
    for pause in (4.0, 7.0, 2.0, 9.0, 1.0):  # at 4, 11, 13, 22 and 23 s
        await trio.sleep(pause)
        progress.add(1)
    seconds = [re.findall(r"\((\d+) s\)", r.getMessage()) for r in caplog.records]
    assert seconds == [["11"], ["22"]]
