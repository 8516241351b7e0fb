"""Prometheus metrics of a worker, on its own registry, served by ``--metrics-port``.

Labels are low-cardinality classes only — outcome, failure type, step, provider — never a job
id, claim token, document key or text. The runtime calls the small ``record_*`` functions
several times per job; each labelled series is looked up once and kept (the label values are a
small fixed set), so a record costs the update alone.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

logger = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)

JOBS = Counter(
    "trioindex_jobs_total",
    "Jobs that ended an attempt on this worker, by outcome and failure type.",
    ["outcome", "failure_type"],
    registry=REGISTRY,
)
STEP_SECONDS = Histogram(
    "trioindex_step_duration_seconds",
    "Duration of pipeline steps.",
    ["step"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
    registry=REGISTRY,
)
EMBED_REQUESTS = Counter(
    "trioindex_embedding_requests_total",
    "Embedding calls made by the embed step, by outcome.",
    ["outcome"],
    registry=REGISTRY,
)
EMBED_SECONDS = Histogram(
    "trioindex_embedding_request_duration_seconds",
    "Latency of the embed step's calls to the embedder (all batches of one job).",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    registry=REGISTRY,
)
SLOTS_IN_USE = Gauge("trioindex_slots_in_use", "Jobs running on this worker.", registry=REGISTRY)
SLOTS_MAX = Gauge("trioindex_slots_max", "max-concurrency of this worker.", registry=REGISTRY)
LEASE_RENEWALS = Counter(
    "trioindex_lease_renewals_total", "Lease renewals, by result.", ["result"], registry=REGISTRY
)
LEASES_LOST = Counter(
    "trioindex_leases_lost_total", "Jobs cancelled because their lease was lost.", registry=REGISTRY
)
RECOVERED = Counter(
    "trioindex_recovered_total",
    "Expired leases returned to the queue by this worker.",
    registry=REGISTRY,
)


@functools.cache
def _jobs(outcome: str, failure_type: str) -> Counter:
    return JOBS.labels(outcome, failure_type)


@functools.cache
def _step(step: str) -> Histogram:
    return STEP_SECONDS.labels(step)


@functools.cache
def _embed_requests(outcome: str) -> Counter:
    return EMBED_REQUESTS.labels(outcome)


@functools.cache
def _renewals(result: str) -> Counter:
    return LEASE_RENEWALS.labels(result)


def record_job(outcome: str, failure_type: str = "") -> None:
    _jobs(outcome, failure_type).inc()


def record_step(step: str, seconds: float) -> None:
    _step(step).observe(seconds)


def record_embedding_call(outcome: str, seconds: float) -> None:
    _embed_requests(outcome).inc()
    EMBED_SECONDS.observe(seconds)


def watch_slots(in_use: Callable[[], float], total: int) -> None:
    """The slots gauges of a worker run: ``in_use`` is read when the metrics are scraped (no
    write per job), ``total`` is set now."""
    SLOTS_IN_USE.set_function(in_use)
    SLOTS_MAX.set(total)


def record_renewal(result: str) -> None:
    _renewals(result).inc()


def record_lease_lost() -> None:
    LEASES_LOST.inc()


def record_recovered(count: int) -> None:
    RECOVERED.inc(count)


def start_metrics_server(port: int, addr: str = "0.0.0.0") -> None:
    """Serve ``/metrics`` from a daemon thread (prometheus_client's own server)."""
    start_http_server(port, addr=addr, registry=REGISTRY)
    logger.info("metrics: serving Prometheus metrics on port %d", port)
