"""The worker process: settings → services → pipeline → runtime, until signalled or drained."""

from __future__ import annotations

import functools
import logging

from trioindex import __version__
from trioindex.config import Settings
from trioindex.services import build_chunker, open_services
from trioindex.values import BackoffPolicy
from trioindex.worker.listen import listen_for_jobs
from trioindex.worker.queue import JobStore
from trioindex.worker.runtime import Worker, serve_until_signalled
from trioindex.worker.steps import PipelineSteps

logger = logging.getLogger(__name__)


def backoff_policy(settings: Settings) -> BackoffPolicy:
    w = settings.worker
    return BackoffPolicy(
        initial=w.retry_backoff_initial, maximum=w.retry_backoff_max, jitter=w.retry_jitter
    )


async def run_worker(settings: Settings, *, drain: bool = False, listen: bool = True) -> Worker:
    """Run one worker to the end; return it (its counters say what happened)."""
    async with open_services(settings, embedder=True) as services:
        assert services.embedder is not None
        steps = PipelineSteps(
            db=services.db,
            store=services.storage,
            chunker=build_chunker(settings, services.embedder),
            embedder=services.embedder,
            max_document_bytes=settings.parsing.max_document_bytes,
            parse_timeout=settings.parsing.timeout,
        )
        store = JobStore(
            services.db,
            lease_seconds=settings.worker.lease_duration,
            backoff=backoff_policy(settings),
        )
        worker = Worker(
            store=store,
            steps=steps,
            settings=settings.worker,
            model_id=services.model.id,
            version=__version__,
            listener=functools.partial(listen_for_jobs, services.database_url) if listen else None,
        )
        await serve_until_signalled(worker, drain=drain)
        return worker
