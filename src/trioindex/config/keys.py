"""The registry of keys: every setting named once, with its rule and its meaning.

One tuple, :data:`KEYS`, names every setting: its key, environment variable, default, kind,
rule and meaning. Loading, validation and the reference table (:mod:`trioindex.config.reference`)
are all driven by it, so a key cannot exist in one place and be missing from another.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping
from typing import Final

import attrs

from trioindex.config.settings import (
    LOCAL_CONCURRENCY,
    LOCAL_MODEL,
    MODEL_NAME_MAX,
    REMOTE_CONCURRENCY,
    SERVER_MODEL,
)
from trioindex.config.units import format_number

ENV_PREFIX: Final = "TRIOINDEX_"

#: The embedding protocols; the HTTP ones need ``embedding.url``, ``local`` takes none.
EMBEDDING_APIS: Final = ("tei", "openai", "local")
URL_APIS: Final = ("tei", "openai")


class Kind(enum.StrEnum):
    """How a key's text is parsed."""

    PATH = "path"
    URL = "URL"
    CHOICE = "choice"
    TEXT = "text"
    SECRET = "secret"
    INT = "integer"
    DURATION = "duration"
    SIZE = "size"
    FRACTION = "number"


@attrs.frozen
class Derived:
    """A default computed from other keys; ``text`` is how the reference table describes it."""

    text: str


@attrs.frozen
class Bound:
    """A numeric range; ``None`` leaves that side open."""

    low: float | None = None
    low_inclusive: bool = True
    high: float | None = None
    high_inclusive: bool = True

    def violation(self, value: float) -> str | None:
        """The rule ``value`` breaks, phrased for an error message, or None."""
        too_low = self.low is not None and (
            value < self.low if self.low_inclusive else value <= self.low
        )
        too_high = self.high is not None and (
            value > self.high if self.high_inclusive else value >= self.high
        )
        if not (too_low or too_high):
            return None
        parts = []
        if self.low is not None:
            parts.append(f"{'>=' if self.low_inclusive else '>'} {format_number(self.low)}")
        if self.high is not None:
            parts.append(f"{'<=' if self.high_inclusive else '<'} {format_number(self.high)}")
        return "must be " + " and ".join(parts)


Default = str | int | float | Derived | None


@attrs.frozen
class KeySpec:
    """One configuration key.

    ``default`` is written as it would be in the TOML file (``"5m"``, ``4``), None for "unset",
    or :class:`Derived` when it follows from other keys. ``field`` is the dotted attribute path
    in :class:`Settings`. ``bound``/``choices``/``schemes``/``max_chars`` are the single-key
    rules that ``rule`` describes; ``grammar``, when set, is a URL key's whole rule, owned by
    the module that reads such URLs (it returns the problem, or None), and ``redact`` how such
    a value is shown (:func:`~trioindex.storage.urls.redact_url` when unset). Rules between
    keys live in :func:`trioindex.config.checks.cross_checks`.
    """

    key: str
    env: str
    default: Default
    kind: Kind
    rule: str
    doc: str
    field: str
    bound: Bound | None = None
    choices: tuple[str, ...] = ()
    schemes: tuple[str, ...] = ()
    grammar: Callable[[str], str | None] | None = None
    redact: Callable[[str], str] | None = None
    max_chars: int | None = None
    secret: bool = False


def env_name(key: str) -> str:
    """``indexing.worker.polling-interval`` → ``TRIOINDEX_WORKER_POLLING_INTERVAL``."""
    bare = key.removeprefix("indexing.")
    return ENV_PREFIX + re.sub(r"[.-]", "_", bare).upper()


def _key(
    key: str,
    default: Default,
    kind: Kind,
    rule: str,
    doc: str,
    *,
    field: str,
    bound: Bound | None = None,
    choices: tuple[str, ...] = (),
    schemes: tuple[str, ...] = (),
    grammar: Callable[[str], str | None] | None = None,
    redact: Callable[[str], str] | None = None,
    max_chars: int | None = None,
    secret: bool = False,
) -> KeySpec:
    return KeySpec(
        key=key,
        env=env_name(key),
        default=default,
        kind=kind,
        rule=rule,
        doc=doc,
        field=field,
        bound=bound,
        choices=choices,
        schemes=schemes,
        grammar=grammar,
        redact=redact,
        max_chars=max_chars,
        secret=secret,
    )


# database.url's grammar and redaction are libpq's, in the database layer: imported when used,
# so that reading the configuration does not load psycopg.
def _database_url_problem(url: str) -> str | None:
    from trioindex.db.pool import database_url_problem

    return database_url_problem(url)


def _storage_url_problem(url: str) -> str | None:
    # imported when used: the storage package loads Trio, which reading settings does not need
    from trioindex.storage.urls import storage_url_problem

    return storage_url_problem(url)


def _redact_database_url(url: str) -> str:
    from trioindex.db.pool import redact_conninfo

    return redact_conninfo(url)


_POSITIVE = Bound(low=0, low_inclusive=False)
_NON_NEGATIVE = Bound(low=0)
_AT_LEAST_ONE = Bound(low=1)

KEYS: Final[tuple[KeySpec, ...]] = (
    _key(
        "home",
        Derived(
            "`.trioindex` in the nearest folder at or above the working directory with a"
            " `trioindex.toml` or `.trioindex/`, else `$XDG_DATA_HOME/trioindex`"
            " (`~/.local/share/trioindex`)"
        ),
        Kind.PATH,
        "a directory; relative paths start at the folder of the file that sets it"
        " (the working directory for TRIOINDEX_HOME)",
        "embedded database and folder store live here",
        field="home",
    ),
    _key(
        "database.url",
        None,
        Kind.URL,
        "postgresql:// URL or key=value connection string (host=db user=u password=p);"
        " (none) = embedded PostgreSQL under home",
        "PostgreSQL to use (password is a secret)",
        field="database.url",
        grammar=_database_url_problem,
        redact=_redact_database_url,
        secret=True,
    ),
    _key(
        "database.pool-size",
        8,
        Kind.INT,
        ">= 1",
        "most connections a process's pool opens (it holds one while idle)",
        field="database.pool_size",
        bound=_AT_LEAST_ONE,
    ),
    _key(
        "database.pool-max-idle",
        "10s",
        Kind.DURATION,
        "> 0",
        "a pooled connection beyond the first unused this long is closed (one per period)",
        field="database.pool_max_idle",
        bound=_POSITIVE,
    ),
    _key(
        "database.pooler",
        "none",
        Kind.CHOICE,
        "one of none|transaction",
        "transaction: database.url is PgBouncer in pool_mode=transaction (no prepared"
        " statements; LISTEN, migrations and index builds use database.direct-url)",
        field="database.pooler",
        choices=("none", "transaction"),
    ),
    _key(
        "database.direct-url",
        None,
        Kind.URL,
        "like database.url; (none) = database.url, or polling for jobs under a transaction pooler",
        "PostgreSQL itself, behind the pooler: LISTEN wake-ups, migrations, index builds",
        field="database.direct_url",
        grammar=_database_url_problem,
        redact=_redact_database_url,
        secret=True,
    ),
    _key(
        "storage.url",
        None,
        Kind.URL,
        "s3://KEY:SECRET@host:port/bucket?secure=false or file:///path; "
        "(none) = folder under home/blobs",
        "object storage for uploaded documents (SECRET is a secret)",
        field="storage.url",
        grammar=_storage_url_problem,
        secret=True,
    ),
    _key(
        "embedding.api",
        Derived("local if embedding.url is unset, else tei"),
        Kind.CHOICE,
        "one of tei|openai|local",
        "embedding protocol: TEI /embed, OpenAI-compatible /v1/embeddings, or in-process",
        field="embedding.api",
        choices=EMBEDDING_APIS,
    ),
    _key(
        "embedding.url",
        None,
        Kind.URL,
        "http(s) URL; required for tei and openai, unset for local",
        "base URL of the embedding server",
        field="embedding.url",
        schemes=("http", "https"),
    ),
    _key(
        "embedding.model",
        Derived(f"{LOCAL_MODEL} for local, {SERVER_MODEL} otherwise"),
        Kind.TEXT,
        f"model name, 1 to {MODEL_NAME_MAX} characters",
        "embedding model; a job is pinned to it when created",
        field="embedding.model",
        max_chars=MODEL_NAME_MAX,
    ),
    _key(
        "embedding.dimension",
        Derived(f"384 for {LOCAL_MODEL}, 1024 for {SERVER_MODEL}"),
        Kind.INT,
        ">= 1; required for other models, must match for these two",
        "vector size the model produces",
        field="embedding.dimension",
        bound=_AT_LEAST_ONE,
    ),
    _key(
        "embedding.api-key",
        None,
        Kind.SECRET,
        "secret; printable ASCII (it is sent in an HTTP header)",
        "bearer token for the embedding server",
        field="embedding.api_key",
        secret=True,
    ),
    _key(
        "embedding.batch-size",
        32,
        Kind.INT,
        ">= 1",
        "chunks per embedding request",
        field="embedding.batch_size",
        bound=_AT_LEAST_ONE,
    ),
    _key(
        "embedding.max-in-flight",
        8,
        Kind.INT,
        ">= 1",
        "embedding requests in flight per worker",
        field="embedding.max_in_flight",
        bound=_AT_LEAST_ONE,
    ),
    _key(
        "embedding.index-min-vectors",
        10000,
        Kind.INT,
        ">= 0",
        "vectors of a model before a worker builds its HNSW index (exact search below)",
        field="embedding.index_min_vectors",
        bound=_NON_NEGATIVE,
    ),
    _key(
        "embedding.request-timeout",
        "60s",
        Kind.DURATION,
        "> 0",
        "per-request HTTP timeout of the embedding client",
        field="embedding.request_timeout",
        bound=_POSITIVE,
    ),
    _key(
        "indexing.worker.polling-interval",
        "1s",
        Kind.DURATION,
        "> 0",
        "how often the poller looks for PENDING jobs when not woken by NOTIFY",
        field="worker.polling_interval",
        bound=_POSITIVE,
    ),
    _key(
        "indexing.worker.max-concurrency",
        Derived(f"{LOCAL_CONCURRENCY} for local, {REMOTE_CONCURRENCY} for tei and openai"),
        Kind.INT,
        ">= 1",
        "jobs one worker runs at once (their chunks share embedding requests)",
        field="worker.max_concurrency",
        bound=_AT_LEAST_ONE,
    ),
    _key(
        "indexing.worker.lease-duration",
        "5m",
        Kind.DURATION,
        "> lease-renewal-interval",
        "how long a claim is held without renewal",
        field="worker.lease_duration",
        bound=_POSITIVE,
    ),
    _key(
        "indexing.worker.lease-renewal-interval",
        "1m",
        Kind.DURATION,
        "> 0 and < lease-duration",
        "how often a running job renews its lease",
        field="worker.lease_renewal_interval",
        bound=_POSITIVE,
    ),
    _key(
        "indexing.worker.shutdown-grace-period",
        "30s",
        Kind.DURATION,
        ">= 0",
        "how long running jobs may finish after a stop signal",
        field="worker.shutdown_grace_period",
        bound=_NON_NEGATIVE,
    ),
    _key(
        "indexing.worker.heartbeat-interval",
        "10s",
        Kind.DURATION,
        "> 0",
        "how often the worker row is touched",
        field="worker.heartbeat_interval",
        bound=_POSITIVE,
    ),
    _key(
        "indexing.worker.heartbeat-timeout",
        "60s",
        Kind.DURATION,
        "> heartbeat-interval",
        'a worker silent this long is "lost"',
        field="worker.heartbeat_timeout",
        bound=_POSITIVE,
    ),
    _key(
        "indexing.worker.recovery-interval",
        "30s",
        Kind.DURATION,
        "> 0",
        "how often expired leases are recovered",
        field="worker.recovery_interval",
        bound=_POSITIVE,
    ),
    _key(
        "indexing.worker.max-attempts",
        5,
        Kind.INT,
        ">= 1",
        "attempts before a job is FAILED",
        field="worker.max_attempts",
        bound=_AT_LEAST_ONE,
    ),
    _key(
        "indexing.worker.retry-backoff-initial",
        "10s",
        Kind.DURATION,
        "> 0",
        "delay before the first retry",
        field="worker.retry_backoff_initial",
        bound=_POSITIVE,
    ),
    _key(
        "indexing.worker.retry-backoff-max",
        "10m",
        Kind.DURATION,
        ">= retry-backoff-initial",
        "longest retry delay",
        field="worker.retry_backoff_max",
        bound=_POSITIVE,
    ),
    _key(
        "indexing.worker.retry-jitter",
        0.2,
        Kind.FRACTION,
        "0 <= x <= 1 (fraction)",
        "random spread applied to each retry delay",
        field="worker.retry_jitter",
        bound=Bound(low=0, high=1),
    ),
    _key(
        "indexing.parsing.max-document-size",
        "50MB",
        Kind.SIZE,
        ">= 1",
        "larger documents fail as DOCUMENT_CONTENT_INVALID",
        field="parsing.max_document_bytes",
        bound=_AT_LEAST_ONE,
    ),
    _key(
        "indexing.parsing.timeout",
        "5m",
        Kind.DURATION,
        "> 0",
        "longest parse + chunk of one document; longer fails as DOCUMENT_CONTENT_INVALID",
        field="parsing.timeout",
        bound=_POSITIVE,
    ),
    _key(
        "indexing.parsing.ocr",
        "auto",
        Kind.CHOICE,
        "one of auto|off",
        "OCR of scanned PDFs and images: auto (when Tesseract reads Korean and English) or off",
        field="parsing.ocr",
        choices=("auto", "off"),
    ),
    _key(
        "indexing.parsing.ocr-low-confidence",
        60,
        Kind.FRACTION,
        "0 <= x <= 100",
        "OCR pages whose mean word confidence (0-100) is under this are marked, and their version",
        field="parsing.ocr_low_confidence",
        bound=Bound(low=0, high=100),
    ),
    _key(
        "indexing.chunking.max-tokens",
        256,
        Kind.INT,
        ">= 8",
        "chunk size when the model tokenizer is known; clamped to the model limit",
        field="parsing.chunk_max_tokens",
        bound=Bound(low=8),
    ),
    _key(
        "indexing.chunking.max-characters",
        1500,
        Kind.INT,
        ">= 50",
        "chunk size without a tokenizer",
        field="parsing.chunk_max_characters",
        bound=Bound(low=50),
    ),
    _key(
        "indexing.chunking.overlap",
        0.1,
        Kind.FRACTION,
        "0 <= x < 0.5 (fraction of the chunk size)",
        "text shared by neighbouring chunks",
        field="parsing.chunk_overlap",
        bound=Bound(low=0, high=0.5, high_inclusive=False),
    ),
    _key(
        "http.webhook-token",
        None,
        Kind.SECRET,
        "secret; printable ASCII (MinIO sends it as Authorization: Bearer TOKEN);"
        " (none) = bucket notifications refused",
        "token of the bucket-notification webhook of `trioindex serve` (MinIO's auth_token)",
        field="http.webhook_token",
        secret=True,
    ),
    _key(
        "http.max-concurrent-requests",
        64,
        Kind.INT,
        ">= 1",
        "requests `trioindex serve` handles at once; more wait, then get 503",
        field="http.max_concurrent_requests",
        bound=_AT_LEAST_ONE,
    ),
    _key(
        "search.bm25-k1",
        1.2,
        Kind.FRACTION,
        ">= 0 (Lucene's default)",
        "BM25 term-frequency saturation of text search",
        field="search.bm25_k1",
        bound=_NON_NEGATIVE,
    ),
    _key(
        "search.bm25-b",
        0.75,
        Kind.FRACTION,
        "0 <= x <= 1 (Lucene's default)",
        "BM25 length normalisation of text search (0: none)",
        field="search.bm25_b",
        bound=Bound(low=0, high=1),
    ),
    _key(
        "search.rerank-url",
        None,
        Kind.URL,
        "http(s) URL of a TEI server with a re-ranker model; (none) = no re-ranking",
        "re-ranker (TEI /rerank) applied to the top of hybrid search",
        field="search.rerank_url",
        schemes=("http", "https"),
    ),
    _key(
        "search.rerank-top-n",
        20,
        Kind.INT,
        "1 to 1000",
        "fused chunks the re-ranker re-orders per query",
        field="search.rerank_top_n",
        bound=Bound(low=1, high=1000),
    ),
    _key(
        "search.rerank-timeout",
        "2s",
        Kind.DURATION,
        "> 0",
        "how long a search waits for the re-ranker before it keeps the fused order",
        field="search.rerank_timeout",
        bound=_POSITIVE,
    ),
    _key(
        "log.format",
        "text",
        Kind.CHOICE,
        "one of text|json",
        "log line format",
        field="log_format",
        choices=("text", "json"),
    ),
)

BY_KEY: Final[Mapping[str, KeySpec]] = {spec.key: spec for spec in KEYS}
