"""The pipeline steps bound to their resources: what a worker's jobs actually run."""

from __future__ import annotations

import attrs
import trio

from trioindex.db.pool import Database
from trioindex.embedding import Embedder
from trioindex.pipeline.chunking import Chunker
from trioindex.pipeline.embed_step import run_embed_step
from trioindex.pipeline.parse_process import DEFAULT_TIMEOUT
from trioindex.pipeline.parse_step import run_parse_step
from trioindex.storage import AsyncObjectStore
from trioindex.values import Claim


@attrs.define(eq=False)
class PipelineSteps:
    """Implements :class:`trioindex.worker.runtime.Steps` with the real steps.

    ``cpu_limiter`` bounds concurrent parse/chunk worker processes (CPU-bound) separately
    from the database and storage limiters (STYLE rule 8); ``parse_timeout`` is
    ``indexing.parsing.timeout``, the most one document's parse may take.
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
