"""The settings values: what loading produces and every other module reads.

The attrs classes here are plain validated values; which key fills which field, and the rules a
value must meet, are in :mod:`trioindex.config.keys`. The embedding model constants live here
because both the registry's derived defaults and the loader's derivation use them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

LOCAL_MODEL: Final = "sentence-transformers/all-MiniLM-L6-v2"
SERVER_MODEL: Final = "BAAI/bge-m3"
#: The longest model name (the CHECK on embedding_models.name); a name is at least 1 character.
MODEL_NAME_MAX: Final = 200
#: Models whose vector size is known, so ``embedding.dimension`` may be left out.
KNOWN_DIMENSIONS: Final[Mapping[str, int]] = {LOCAL_MODEL: 384, SERVER_MODEL: 1024}
# indexing.worker.max-concurrency by embedder: the local model embeds in this process, while a
# remote server is waited on, and the chunks of dozens of jobs share its requests.
LOCAL_CONCURRENCY: Final = 2
REMOTE_CONCURRENCY: Final = 256


@attrs.frozen
class WorkerSettings:
    """``indexing.worker.*``; every duration is in seconds."""

    polling_interval: float
    max_concurrency: int
    lease_duration: float
    lease_renewal_interval: float
    shutdown_grace_period: float
    heartbeat_interval: float
    heartbeat_timeout: float
    recovery_interval: float
    max_attempts: int
    retry_backoff_initial: float
    retry_backoff_max: float
    retry_jitter: float


@attrs.frozen
class EmbeddingSettings:
    """``embedding.*``; ``request_timeout`` is in seconds."""

    api: str
    url: str | None
    model: str
    dimension: int
    api_key: str | None = attrs.field(repr=False)
    batch_size: int
    max_in_flight: int
    request_timeout: float
    index_min_vectors: int = 10_000


@attrs.frozen
class DatabaseSettings:
    """``database.*``; ``url`` None means the embedded PostgreSQL under ``home``."""

    url: str | None = attrs.field(repr=False)
    pool_size: int
    pool_max_idle: float = 10.0
    pooler: str = "none"  # "transaction": database.url is a transaction-pooling proxy
    direct_url: str | None = attrs.field(default=None, repr=False)


@attrs.frozen
class StorageSettings:
    """``storage.*``; ``url`` None means the folder store under ``home/blobs``."""

    url: str | None = attrs.field(repr=False)


@attrs.frozen
class ParsingSettings:
    """``indexing.parsing.*`` and ``indexing.chunking.*``; ``timeout`` is in seconds."""

    max_document_bytes: int
    timeout: float
    chunk_max_tokens: int
    chunk_max_characters: int
    chunk_overlap: float
    ocr: str = "auto"  # "off": scanned PDFs and images are refused without OCR
    ocr_low_confidence: float = 60.0  # an OCR page's mean word confidence under this is marked


@attrs.frozen
class HttpSettings:
    """``http.*``: the HTTP service (``trioindex serve``); ``webhook_token`` None refuses bucket
    notifications."""

    webhook_token: str | None = attrs.field(default=None, repr=False)
    max_concurrent_requests: int = 64


@attrs.frozen
class SearchSettings:
    """``search.*``: BM25's parameters and the optional re-ranker (``rerank_url`` None: none)."""

    bm25_k1: float = 1.2
    bm25_b: float = 0.75
    rerank_url: str | None = None
    rerank_top_n: int = 20
    rerank_timeout: float = 2.0


@attrs.frozen
class Settings:
    """Everything configurable, validated. ``home`` is absolute."""

    home: Path
    database: DatabaseSettings
    storage: StorageSettings
    embedding: EmbeddingSettings
    worker: WorkerSettings
    parsing: ParsingSettings
    log_format: str
    http: HttpSettings = HttpSettings()
    search: SearchSettings = SearchSettings()

    def with_overrides(self, **changes: Any) -> Settings:
        """A validated copy with ``changes`` applied.

        Keywords are the fields of :class:`Settings`; a section may be given whole or as a
        mapping of the fields to change, e.g. ``with_overrides(worker={"max_concurrency": 4})``.
        Raises :class:`ConfigError` when the result breaks a rule (source "override").
        """
        # Imported here: validation needs the registry, which needs these classes.
        from trioindex.config.loading import apply_overrides

        return apply_overrides(self, changes)
