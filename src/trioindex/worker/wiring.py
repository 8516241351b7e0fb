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
from collections.abc import Awaitable, Callable
from pathlib import Path
from uuid import UUID

import attrs
import trio

from trioindex import __version__
from trioindex.config import Settings
from trioindex.db.jobs import complete_job
from trioindex.db.pool import Database
from trioindex.db.steps import (
    ChunkCommit,
    DocumentCommit,
    EmbeddingCommit,
    EmbedSnapshot,
    StoredSlice,
    begin_embedding,
    store_chunks_many,
    store_documents_many,
    store_embeddings_many,
    whole_snapshot,
)
from trioindex.embedding import Embedder
from trioindex.embedding.batching import EmbeddingCoalescer
from trioindex.embedding.warm import lend_if_local
from trioindex.errors import StateInconsistent
from trioindex.pipeline.chunk_values import ChunkingPolicy
from trioindex.pipeline.chunking import Chunker
from trioindex.pipeline.embed_step import SLICE_ROWS, drafts_from_matrix
from trioindex.pipeline.formats import DEFAULT_OCR
from trioindex.pipeline.parse_process import DEFAULT_TIMEOUT
from trioindex.pipeline.parse_step import INLINE_PARSE_BYTES, parse_and_store
from trioindex.pipeline.step_progress import StepProgress
from trioindex.services import Services, open_services
from trioindex.storage import AsyncObjectStore
from trioindex.storage.grouped_reads import GroupedReads
from trioindex.values import (
    CHARACTER_CHUNKING,
    BackoffPolicy,
    Claim,
    CompleteResult,
    ParseSnapshot,
    token_chunking,
)
from trioindex.worker import collector
from trioindex.worker.committer import GroupCommitter
from trioindex.worker.document_budget import DocumentBudget
from trioindex.worker.index_keeper import VectorIndexKeeper
from trioindex.worker.listen import listen_for_jobs
from trioindex.worker.queue import JobQueue
from trioindex.worker.runtime import Worker, serve_until_signalled

logger = logging.getLogger(__name__)

# A document of at most this many bytes is stored whole, once its chunks are embedded: chunks,
# vectors and completion in one transaction. Its chunks are not kept across a failed embed
# step, since reading and parsing it again costs less than storing them first (the size the
# worker parses in its own thread); a larger document stores its chunks first, so a retry
# embeds them without parsing again.
WHOLE_DOCUMENT_BYTES = INLINE_PARSE_BYTES


@attrs.define(eq=False)
class PipelineSteps:
    """Implements :class:`trioindex.worker.job.Steps` with the real steps.

    ``cpu_limiter`` bounds concurrent parse/chunk worker processes (CPU-bound) separately from
    the database and storage limiters, so parsing cannot starve either of threads;
    ``parse_timeout`` is ``indexing.parsing.timeout``, the most one document's parse may take.

    Worker-wide (run by :meth:`serve`): the :class:`EmbeddingCoalescer` that gathers the chunks
    of many jobs into full embedding requests, and three group committers (chunks + embed
    prepare; vectors + completion; a small document's chunks, vectors and completion), each
    writing the steps of many jobs in one transaction. A document of at most
    :data:`WHOLE_DOCUMENT_BYTES` is stored whole by the last, after its embed step (nothing of
    it is written before); a larger one stores its chunks after the parse, and its vectors go
    through the second in slices of :data:`~trioindex.pipeline.embed_step.SLICE_ROWS`, the final
    slice completing the job. What a job's steps hand on to its next step (the embed snapshot,
    the chunks not stored yet, the vectors) is kept per claim until :meth:`forget`.
    ``index_keeper`` (when given) is told how many vectors each completion stored;
    :func:`run_worker` runs it.
    """

    db: Database
    store: AsyncObjectStore
    chunker: Chunker
    embedder: Embedder
    max_document_bytes: int
    parse_timeout: float = DEFAULT_TIMEOUT
    ocr: bool = True  # indexing.parsing.ocr is not "off"
    ocr_low_confidence: float = DEFAULT_OCR.low_confidence  # indexing.parsing.ocr-low-confidence
    cpu_limiter: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(2))
    max_in_flight: int = 4
    # large documents reserve their size from before their bytes are read until the job ends
    large_documents: DocumentBudget = attrs.field(factory=DocumentBudget)
    index_keeper: VectorIndexKeeper | None = None
    whole_document_bytes: int = WHOLE_DOCUMENT_BYTES  # at most this size: stored whole
    # a completion with no vectors to store (a replayed embed step): the job queue's grouped
    # completion (JobQueue.complete) when given, else one transaction of its own
    complete_alone: Callable[[Claim], Awaitable[CompleteResult]] | None = None
    coalescer: EmbeddingCoalescer = attrs.field(init=False)
    store_chunks: GroupCommitter[ChunkCommit, EmbedSnapshot | int] = attrs.field(init=False)
    store_embeddings: GroupCommitter[EmbeddingCommit, StoredSlice] = attrs.field(init=False)
    store_documents: GroupCommitter[DocumentCommit, StoredSlice] = attrs.field(init=False)
    # a small document's read shares its thread hop with the other jobs claimed with it
    small_reads: GroupedReads = attrs.field(init=False)
    _embed_from: dict[UUID, EmbedSnapshot] = attrs.field(init=False, factory=dict)
    _unstored: dict[UUID, ChunkCommit] = attrs.field(init=False, factory=dict)
    _to_store: dict[UUID, EmbeddingCommit] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        info = self.embedder.info
        self.coalescer = EmbeddingCoalescer(
            embed_one=self.embedder.embed,
            max_batch_size=max(1, info.max_batch_size),
            max_batch_tokens=info.max_batch_tokens,
            max_in_flight=self.max_in_flight,
        )
        self.store_chunks = GroupCommitter(
            "chunks", self.db, store_chunks_many, weight=lambda c: c.weight
        )
        self.store_embeddings = GroupCommitter(
            "embeddings", self.db, store_embeddings_many, weight=lambda c: c.weight
        )
        self.store_documents = GroupCommitter(
            "documents", self.db, store_documents_many, weight=lambda c: c.weight
        )
        self.small_reads = GroupedReads.over(self.store)

    async def serve(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.coalescer.serve)
            nursery.start_soon(self.store_chunks.serve)
            nursery.start_soon(self.store_embeddings.serve)
            nursery.start_soon(self.store_documents.serve)

    async def parse(self, claim: Claim) -> int:
        small = claim.parse is not None and claim.parse.byte_size <= self.whole_document_bytes
        if small:
            # a small document is parsed in milliseconds: its texts reach the coalescer soon,
            # and requests that are not full wait for them (EmbeddingCoalescer.expect)
            self.coalescer.expect(claim.job_id)

        async def admit(snapshot: ParseSnapshot) -> None:
            await self.large_documents.reserve(claim.job_id, snapshot.byte_size)

        async def commit(item: ChunkCommit) -> EmbedSnapshot | int:
            # the parse result was received on this thread; the statement is built in another
            self.large_documents.phase_done(claim.job_id)
            info = self.embedder.info
            if info.dimension is not None and self._stored_whole(item):
                self._unstored[claim.job_id] = item  # stored with its vectors
                return whole_snapshot(item, claim.embedding_model_id, info.model, info.dimension)
            return await self.store_chunks.submit(item)

        result = await parse_and_store(
            claim,
            commit=commit,
            admit=admit,
            # a large document's read has a thread of its own: it would hold up small ones
            store=self.small_reads if small else self.store,
            chunker=self.chunker,
            max_bytes=self.max_document_bytes,
            parse_timeout=self.parse_timeout,
            ocr=self.ocr,
            ocr_low_confidence=self.ocr_low_confidence,
            cpu_limiter=self.cpu_limiter,
        )
        self.large_documents.phase_done(claim.job_id)  # the statement's parameters are freed
        if isinstance(result, int):
            return result
        self._embed_from[claim.job_id] = result
        return len(result.chunks)

    def _stored_whole(self, item: ChunkCommit) -> bool:
        """Whether the document is stored whole after its embed step (see
        :data:`WHOLE_DOCUMENT_BYTES`); a scan with pages to review stores its chunks first,
        with the version's mark."""
        return (
            item.snapshot.byte_size <= self.whole_document_bytes
            and 0 < len(item.chunks) <= SLICE_ROWS
            and not item.low_confidence_pages
        )

    async def embed(self, claim: Claim) -> int:
        snapshot = self._embed_from.pop(claim.job_id, None)
        if snapshot is None:  # the claim started at embed, or the parse was a replay
            snapshot = await self.db.run(begin_embedding, claim)
        if snapshot.complete:
            logger.debug("job %s: embedding set already complete, step replayed", claim.job_id)
            return len(snapshot.chunks)
        # the texts go to the coalescer alone, which drops each one once its vector arrived:
        # a large document's text is freed while it is embedded, and never held with its drafts
        # (a document stored whole holds its chunks, texts included, until that store anyway)
        texts = snapshot.texts()
        if claim.job_id not in self._unstored:
            snapshot = snapshot.without_texts()
        progress = StepProgress(claim.job_id, len(texts))
        matrix = await self.coalescer.embed(
            texts, snapshot.dimension, release=True, on_arrived=progress.add, key=claim.job_id
        )
        del texts
        drafts = drafts_from_matrix(snapshot, matrix)
        self._to_store[claim.job_id] = EmbeddingCommit(claim, snapshot, drafts)
        return len(drafts)

    async def complete(self, claim: Claim) -> CompleteResult:
        commit = self._to_store.pop(claim.job_id, None)
        if commit is None:  # a replayed embed step: only the completion is left
            if self.complete_alone is not None:
                return await self.complete_alone(claim)
            return await self.db.run(complete_job, claim)
        drafts = commit.drafts
        unstored = self._unstored.pop(claim.job_id, None)
        if unstored is not None:
            stored = await self.store_documents.submit(DocumentCommit(unstored, commit))
            if stored.result is None:
                raise StateInconsistent("the whole document's store did not complete the job")
            if self.index_keeper is not None:
                self.index_keeper.note_stored(len(drafts))
            return stored.result
        for offset in range(0, len(drafts), SLICE_ROWS):
            piece = EmbeddingCommit(
                claim, commit.snapshot, drafts[offset : offset + SLICE_ROWS], offset
            )
            stored = await self.store_embeddings.submit(piece)
            if stored.result is not None:  # the slice ended the set (or found it complete)
                if self.index_keeper is not None:
                    self.index_keeper.note_stored(len(drafts))
                return stored.result
        raise StateInconsistent("the vector set did not complete the job")

    def forget(self, claim: Claim) -> None:
        self.coalescer.settle(claim.job_id)
        self._embed_from.pop(claim.job_id, None)
        self._to_store.pop(claim.job_id, None)
        self._unstored.pop(claim.job_id, None)
        self.large_documents.release(claim.job_id)


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
    server_limit = embedder.info.max_input_tokens  # character chunks stay under it
    return Chunker(ChunkingPolicy(size, int(size * p.chunk_overlap), server_limit))


def chunk_set_of(chunker: Chunker, model_name: str) -> str:
    """The chunk set ``chunker`` makes for the model named ``model_name``: character chunks
    are shared by every model; token-aware ones are the model's own."""
    return token_chunking(model_name) if chunker.token_aware else CHARACTER_CHUNKING


def backoff_policy(settings: Settings) -> BackoffPolicy:
    w = settings.worker
    return BackoffPolicy(
        initial=w.retry_backoff_initial, maximum=w.retry_backoff_max, jitter=w.retry_jitter
    )


def build_worker(
    settings: Settings,
    services: Services,
    *,
    listen: bool = True,
    index_keeper: VectorIndexKeeper | None = None,
) -> Worker:
    """A worker over ``services`` (opened with ``embedder=True``), configured by ``settings``;
    it tells ``index_keeper`` (run by the caller) how many vectors it stores."""
    embedder = services.embedder
    if embedder is None:
        raise ValueError("a worker needs an embedder: open the services with embedder=True")
    chunker = build_chunker(settings, embedder)
    queue = JobQueue(
        services.db,
        lease_seconds=settings.worker.lease_duration,
        backoff=backoff_policy(settings),
    )
    steps = PipelineSteps(
        db=services.db,
        store=services.storage,
        chunker=chunker,
        embedder=embedder,
        max_document_bytes=settings.parsing.max_document_bytes,
        parse_timeout=settings.parsing.timeout,
        ocr=settings.parsing.ocr != "off",
        ocr_low_confidence=settings.parsing.ocr_low_confidence,
        max_in_flight=settings.embedding.max_in_flight,
        index_keeper=index_keeper,
        complete_alone=queue.complete,
    )
    return Worker(
        queue=queue,
        steps=steps,
        settings=settings.worker,
        model_id=services.model.id,
        chunking=chunk_set_of(chunker, services.model.name),
        version=__version__,
        listener=(
            functools.partial(listen_for_jobs, services.direct_url)
            if listen and services.direct_url is not None
            else None
        ),
    )


def _index_keeper(settings: Settings, services: Services) -> VectorIndexKeeper | None:
    """The keeper of the model's HNSW index, on a session of its own (PostgreSQL itself); None
    behind a transaction pooler without ``database.direct-url``, where a build's session lock
    and ``CREATE INDEX CONCURRENTLY`` have no session to run on (said once, at start)."""
    if services.direct_url is None:
        logger.warning(
            "model %s: this worker builds no HNSW index: behind a transaction pooler a build"
            " needs a session of its own (set database.direct-url to PostgreSQL itself)",
            services.model.name,
        )
        return None
    return VectorIndexKeeper(
        services.direct_url, services.model, settings.embedding.index_min_vectors
    )


async def run_worker(
    settings: Settings, *, drain: bool = False, listen: bool = True, own_process: bool = False
) -> Worker:
    """Run one worker to the end; return it (its counters say what happened).

    ``own_process`` says the process exists to run this worker (the ``worker`` command): once
    the services are open, the garbage collector is tuned for it (:func:`collector.settle`).
    A caller that runs a worker inside a process of its own (a test, an application) keeps its
    collector as it was."""
    async with open_services(settings, embedder=True) as services:
        if own_process:
            collector.settle()  # what is loaded now lives as long as the process
        keeper = _index_keeper(settings, services)
        worker = build_worker(settings, services, listen=listen, index_keeper=keeper)
        async with trio.open_nursery() as nursery:
            # beside the worker, not in it: a build under way when a drain ends is finished,
            # not cancelled and started again
            if keeper is not None:
                nursery.start_soon(keeper.serve)
            # searches of this home borrow a local model
            assert services.embedder is not None
            await nursery.start(
                lend_if_local, settings.embedding.api, settings.home, services.embedder
            )
            await serve_until_signalled(worker, drain=drain)
            if drain and keeper is not None:
                # a bulk load ends with its index, if it is due: a first build sent to a
                # PostgreSQL of the user's own, on a session of its own (not through a
                # transaction pooler), is left to the server to finish; the embedded one stops
                # with its last user, so there the drain waits for it
                await keeper.check(hand_off=bool(settings.database.url))
            nursery.cancel_scope.cancel()
        return worker
