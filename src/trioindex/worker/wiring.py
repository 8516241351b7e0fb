"""Building a worker from settings, and running it: the one place a worker is put together.

Settings flow one way. :func:`run_worker` opens the shared resources that CLI commands use too
(:func:`trioindex.services.open_services`: database, object store, embedding model row,
embedder); :func:`build_worker` binds the pipeline steps to them (:class:`PipelineSteps`) and
makes the job queue and the runtime's :class:`~trioindex.worker.runtime.Worker` from the same
settings; :func:`~trioindex.worker.runtime.serve_until_signalled` runs it.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import attrs
import trio

from trioindex import __version__
from trioindex.config import Settings
from trioindex.db.pool import Database
from trioindex.embedding import Embedder
from trioindex.pipeline.chunking import Chunker, ChunkingPolicy
from trioindex.pipeline.embed_step import run_embed_step
from trioindex.pipeline.parse_process import DEFAULT_TIMEOUT
from trioindex.pipeline.parse_step import run_parse_step
from trioindex.services import Services, open_services
from trioindex.storage import AsyncObjectStore
from trioindex.values import BackoffPolicy, Claim
from trioindex.worker.listen import listen_for_jobs
from trioindex.worker.queue import JobQueue
from trioindex.worker.runtime import Worker, serve_until_signalled

logger = logging.getLogger(__name__)


@attrs.define(eq=False)
class PipelineSteps:
    """Implements :class:`trioindex.worker.job.Steps` with the real steps.

    ``cpu_limiter`` bounds concurrent parse/chunk worker processes (CPU-bound) separately from
    the database and storage limiters, so parsing cannot starve either of threads;
    ``parse_timeout`` is ``indexing.parsing.timeout``, the most one document's parse may take.
    """

    db: Database
    store: AsyncObjectStore
    chunker: Chunker
    embedder: Embedder
    max_document_bytes: int
    parse_timeout: float = DEFAULT_TIMEOUT
    cpu_limiter: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(2))

    async def parse(self, claim: Claim) -> int:
        return await run_parse_step(
            claim,
            db=self.db,
            store=self.store,
            chunker=self.chunker,
            max_bytes=self.max_document_bytes,
            parse_timeout=self.parse_timeout,
            cpu_limiter=self.cpu_limiter,
        )

    async def embed(self, claim: Claim) -> int:
        return await run_embed_step(claim, db=self.db, embedder=self.embedder)


def build_chunker(settings: Settings, embedder: Embedder) -> Chunker:
    """Token-aware with the local model's tokenizer, character-based otherwise."""
    p = settings.parsing
    model_dir: Path | None = getattr(embedder, "model_dir", None)
    if model_dir is not None and (model_dir / "tokenizer.json").exists():
        limit = embedder.info.max_input_tokens or p.chunk_max_tokens
        size = min(p.chunk_max_tokens, limit)
        policy = ChunkingPolicy(max_size=size, overlap=int(size * p.chunk_overlap))
        return Chunker.for_model_dir(policy, model_dir)
    size = p.chunk_max_characters
    return Chunker(ChunkingPolicy(max_size=size, overlap=int(size * p.chunk_overlap)))


def backoff_policy(settings: Settings) -> BackoffPolicy:
    w = settings.worker
    return BackoffPolicy(
        initial=w.retry_backoff_initial, maximum=w.retry_backoff_max, jitter=w.retry_jitter
    )


def build_worker(settings: Settings, services: Services, *, listen: bool = True) -> Worker:
    """A worker over ``services`` (opened with ``embedder=True``), configured by ``settings``."""
    embedder = services.embedder
    if embedder is None:
        raise ValueError("a worker needs an embedder: open the services with embedder=True")
    steps = PipelineSteps(
        db=services.db,
        store=services.storage,
        chunker=build_chunker(settings, embedder),
        embedder=embedder,
        max_document_bytes=settings.parsing.max_document_bytes,
        parse_timeout=settings.parsing.timeout,
    )
    queue = JobQueue(
        services.db,
        lease_seconds=settings.worker.lease_duration,
        backoff=backoff_policy(settings),
    )
    return Worker(
        queue=queue,
        steps=steps,
        settings=settings.worker,
        model_id=services.model.id,
        version=__version__,
        listener=functools.partial(listen_for_jobs, services.database_url) if listen else None,
    )


async def run_worker(settings: Settings, *, drain: bool = False, listen: bool = True) -> Worker:
    """Run one worker to the end; return it (its counters say what happened)."""
    async with open_services(settings, embedder=True) as services:
        worker = build_worker(settings, services, listen=listen)
        await serve_until_signalled(worker, drain=drain)
        return worker
