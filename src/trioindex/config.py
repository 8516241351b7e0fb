"""Configuration: the registry of keys, and loading, validating and documenting them.

One tuple, :data:`KEYS`, names every setting once: its key, environment variable, default,
kind, rule and meaning. Loading, validation and the reference table in
``docs/design/configuration.md`` (:func:`reference_markdown`) are all driven by it, so a key
cannot exist in one place and be missing from another.

Values come from three layers, later ones winning::

    defaults  <  trioindex.toml (or the file named by TRIOINDEX_CONFIG)  <  TRIOINDEX_* variables

Every problem found is collected and raised as one :class:`~trioindex.errors.ConfigError`,
one line per problem, each naming the key, the value and where the value came from. Secrets
(database URL password, storage URL secret, embedding API key) are never shown: URLs are
redacted before they appear in a message and the settings classes keep them out of ``repr``.
"""

from __future__ import annotations

import difflib
import enum
import logging
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import attrs

from trioindex.errors import ConfigError

logger = logging.getLogger(__name__)

CONFIG_ENV: Final = "TRIOINDEX_CONFIG"
CONFIG_FILENAME: Final = "trioindex.toml"
ENV_PREFIX: Final = "TRIOINDEX_"

LOCAL_MODEL: Final = "sentence-transformers/all-MiniLM-L6-v2"
SERVER_MODEL: Final = "BAAI/bge-m3"
#: Models whose vector size is known, so ``embedding.dimension`` may be left out.
KNOWN_DIMENSIONS: Final[Mapping[str, int]] = {LOCAL_MODEL: 384, SERVER_MODEL: 1024}


# --------------------------------------------------------------------------------------------
# Settings values


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


@attrs.frozen
class DatabaseSettings:
    """``database.*``; ``url`` None means the embedded PostgreSQL under ``home``."""

    url: str | None = attrs.field(repr=False)
    pool_size: int


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

    def with_overrides(self, **changes: Any) -> Settings:
        """A validated copy with ``changes`` applied.

        Keywords are the fields of :class:`Settings`; a section may be given whole or as a
        mapping of the fields to change, e.g. ``with_overrides(worker={"max_concurrency": 4})``.
        Raises :class:`ConfigError` when the result breaks a rule (source "override").
        """
        return _with_overrides(self, changes)


# --------------------------------------------------------------------------------------------
# The registry


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
            parts.append(f"{'>=' if self.low_inclusive else '>'} {_number(self.low)}")
        if self.high is not None:
            parts.append(f"{'<=' if self.high_inclusive else '<'} {_number(self.high)}")
        return "must be " + " and ".join(parts)


Default = str | int | float | Derived | None


@attrs.frozen
class KeySpec:
    """One configuration key.

    ``default`` is written as it would be in the TOML file (``"5m"``, ``4``), None for "unset",
    or :class:`Derived` when it follows from other keys. ``field`` is the dotted attribute path
    in :class:`Settings`. ``bound``/``choices``/``schemes`` are the single-key rules that
    ``rule`` describes; rules between keys live in :func:`_cross_checks`.
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
        secret=secret,
    )


_POSITIVE = Bound(low=0, low_inclusive=False)
_NON_NEGATIVE = Bound(low=0)
_AT_LEAST_ONE = Bound(low=1)

KEYS: Final[tuple[KeySpec, ...]] = (
    _key(
        "home",
        "./.trioindex",
        Kind.PATH,
        "a directory; relative paths start at the working directory",
        "embedded database and folder store live here",
        field="home",
    ),
    _key(
        "database.url",
        None,
        Kind.URL,
        "postgresql:// URL; (none) = embedded PostgreSQL under home",
        "PostgreSQL to use (password is a secret)",
        field="database.url",
        schemes=("postgresql", "postgres"),
        secret=True,
    ),
    _key(
        "database.pool-size",
        4,
        Kind.INT,
        ">= 1",
        "connections in the pool",
        field="database.pool_size",
        bound=_AT_LEAST_ONE,
    ),
    _key(
        "storage.url",
        None,
        Kind.URL,
        "s3://KEY:SECRET@host:port/bucket?secure=false or file:///path; "
        "(none) = folder under home/blobs",
        "object storage for uploaded documents (SECRET is a secret)",
        field="storage.url",
        schemes=("s3", "file"),
        secret=True,
    ),
    _key(
        "embedding.api",
        Derived("local if embedding.url is unset, else tei"),
        Kind.CHOICE,
        "one of tei|openai|local",
        "embedding protocol: TEI /embed, OpenAI-compatible /v1/embeddings, or in-process",
        field="embedding.api",
        choices=("tei", "openai", "local"),
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
        "model name",
        "embedding model; a job is pinned to it when created",
        field="embedding.model",
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
        "secret",
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
        4,
        Kind.INT,
        ">= 1",
        "embedding requests in flight per worker",
        field="embedding.max_in_flight",
        bound=_AT_LEAST_ONE,
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
        2,
        Kind.INT,
        ">= 1",
        "jobs one worker runs at once",
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
        "log.format",
        "text",
        Kind.CHOICE,
        "one of text|json",
        "log line format",
        field="log_format",
        choices=("text", "json"),
    ),
)

_BY_KEY: Final[Mapping[str, KeySpec]] = {spec.key: spec for spec in KEYS}


# --------------------------------------------------------------------------------------------
# Durations and sizes

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h)")
_DURATION_UNITS: Final[Mapping[str, Decimal]] = {
    "ms": Decimal("0.001"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?", re.IGNORECASE)
_SIZE_UNITS: Final[Mapping[str, int]] = {
    "b": 1,
    **{f"{p}b": 1000 ** (n + 1) for n, p in enumerate("kmgt")},
    **{f"{p}ib": 1024 ** (n + 1) for n, p in enumerate("kmgt")},
}


def parse_duration(text: str | int | float) -> float:
    """Seconds in ``text``: ``"500ms"``, ``"1.5s"``, ``"5m"``, ``"1h"``, or a number of seconds.

    A string needs a unit (a bare ``"500"`` is ambiguous between seconds and milliseconds);
    a TOML integer or float is seconds. Raises ValueError for negative, non-finite or
    malformed values.
    """
    try:
        return _duration(text)
    except _Invalid as exc:
        raise ValueError(f"{exc}, got {_show(text)}") from None


def parse_size(text: str | int) -> int:
    """Bytes in ``text``: ``"50MB"`` (powers of 1000), ``"512KiB"`` (powers of 1024) or a number.

    Raises ValueError for negative, fractional-byte or malformed values.
    """
    try:
        return _size(text)
    except _Invalid as exc:
        raise ValueError(f"{exc}, got {_show(text)}") from None


class _Invalid(Exception):
    """A single value breaks a rule; the message is the rule, without the value."""


def _duration(raw: object) -> float:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        if not math.isfinite(raw) or raw < 0:
            raise _Invalid("must be a non-negative number of seconds")
        return float(raw)
    match = _DURATION.fullmatch(raw.strip()) if isinstance(raw, str) else None
    if match is None:
        raise _Invalid("must be a duration such as 500ms, 30s, 5m or 1h")
    number, unit = match.groups()
    return float(Decimal(number) * _DURATION_UNITS[unit])


def _size(raw: object) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw < 0:
            raise _Invalid("must be a non-negative number of bytes")
        return raw
    match = _SIZE.fullmatch(raw.strip()) if isinstance(raw, str) else None
    if match is None:
        raise _Invalid("must be a size such as 50MB, 512KiB or 1048576 (bytes)")
    number, unit = match.groups()
    size = Decimal(number) * _SIZE_UNITS[(unit or "b").lower()]
    if size != size.to_integral_value():
        raise _Invalid("must be a whole number of bytes")
    return int(size)


# --------------------------------------------------------------------------------------------
# Loading


@attrs.frozen
class _Origin:
    """Where a value came from and how the person wrote it (for error messages)."""

    raw: object
    source: str


def load_settings(*, environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> Settings:
    """Settings from defaults, the TOML file and ``TRIOINDEX_*`` variables, validated.

    ``environ`` defaults to ``os.environ``, ``cwd`` to the working directory. The file is
    ``$TRIOINDEX_CONFIG`` (relative to ``cwd``; it must exist) or ``cwd/trioindex.toml`` if
    present. Raises :class:`ConfigError` listing every problem found.
    """
    env = os.environ if environ is None else environ
    base = Path.cwd() if cwd is None else cwd
    errors: list[str] = []
    origins: dict[str, _Origin] = {}

    path = _config_path(env, base, errors)
    if path is not None:
        origins.update(_read_file(path, errors))
    for spec in KEYS:
        if spec.env in env:
            origins[spec.key] = _Origin(env[spec.env], spec.env)
    _warn_unknown_env(env)

    settings = _resolve(origins, base, errors)
    if errors or settings is None:
        # Registry order reads like the file; file-level problems come first.
        rank = {spec.key: n for n, spec in enumerate(KEYS)}
        errors.sort(key=lambda line: rank.get(line.split(":", 1)[0], -1))
        raise ConfigError(_join(errors))
    logger.debug("configuration loaded (file: %s)", path or "none")
    return settings


def default_settings(**overrides: Any) -> Settings:
    """The defaults (no file, no environment), with ``overrides`` as in ``with_overrides``."""
    errors: list[str] = []
    settings = _resolve({}, Path.cwd(), errors)
    # The registry's own defaults are valid; a failure here is a bug in KEYS.
    assert settings is not None and not errors, errors
    return _with_overrides(settings, overrides) if overrides else settings


def _config_path(env: Mapping[str, str], base: Path, errors: list[str]) -> Path | None:
    named = env.get(CONFIG_ENV, "")
    if named:
        path = base / Path(named).expanduser()
        if not path.is_file():
            errors.append(f"{CONFIG_ENV}: no such file, got {_show(named)}")
            return None
        return path
    default = base / CONFIG_FILENAME
    return default if default.is_file() else None


def _read_file(path: Path, errors: list[str]) -> dict[str, _Origin]:
    try:
        with path.open("rb") as file:
            document = tomllib.load(file)
    except OSError as exc:
        errors.append(f"{path}: cannot read: {exc.strerror}")
        return {}
    except tomllib.TOMLDecodeError as exc:
        # tomllib's messages give a position, never the offending text (which may be a secret).
        errors.append(f"{path}: invalid TOML: {exc}")
        return {}
    origins: dict[str, _Origin] = {}
    for key, value in _flatten_table(document):
        if key in _BY_KEY:
            if isinstance(value, dict):
                errors.append(f"{key}: expected a value, got a table (from {path})")
            else:
                origins[key] = _Origin(value, str(path))
        else:
            errors.append(_unknown_key(key, path))
    return origins


def _flatten_table(table: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    pairs: list[tuple[str, Any]] = []
    for name, value in table.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict) and key not in _BY_KEY:
            pairs.extend(_flatten_table(value, key + "."))
        else:
            pairs.append((key, value))
    return pairs


def _unknown_key(key: str, path: Path) -> str:
    close = difflib.get_close_matches(key, list(_BY_KEY), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"{key}: unknown key{hint} (in {path})"


def _warn_unknown_env(env: Mapping[str, str]) -> None:
    # A misspelt variable would otherwise be ignored without a trace. Names only: values may
    # be secrets. TRIOINDEX_TEST_* belong to the test suite.
    known = {spec.env for spec in KEYS} | {CONFIG_ENV}
    for name in sorted(env):
        test_only = name.startswith(ENV_PREFIX + "TEST_")
        if name.startswith(ENV_PREFIX) and name not in known and not test_only:
            logger.warning("ignoring unknown environment variable %s", name)


def _resolve(origins: Mapping[str, _Origin], base: Path, errors: list[str]) -> Settings | None:
    """Parse every key, fill the derived defaults, check the rules, build the settings.

    A key that fails to parse is left out of ``values``; the checks skip what depends on it,
    so every other problem is still reported in the same error.
    """
    values: dict[str, Any] = {}
    shown = dict(origins)
    failed: set[str] = set()
    for spec in KEYS:
        origin = origins.get(spec.key)
        if origin is None:
            if isinstance(spec.default, Derived):
                continue
            origin = shown[spec.key] = _Origin(spec.default, "default")
        try:
            values[spec.key] = _parse(spec, origin.raw, base)
        except _Invalid as exc:
            errors.append(_line(spec, str(exc), origin))
            failed.add(spec.key)
    _derive_embedding(values, shown, failed, errors)
    errors.extend(_check(values, shown))
    return None if errors else _build(values)


def _parse(spec: KeySpec, raw: object, base: Path) -> object:
    optional = spec.default is None or isinstance(spec.default, Derived)
    if optional and (raw is None or (isinstance(raw, str) and not raw.strip())):
        # An empty variable (TRIOINDEX_DATABASE_URL=) unsets the key, also over the file.
        return None
    if spec.kind is Kind.DURATION:
        return _duration(raw)
    if spec.kind is Kind.SIZE:
        return _size(raw)
    if spec.kind is Kind.INT:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and re.fullmatch(r"\s*[+-]?\d+\s*", raw):
            return int(raw)
        raise _Invalid("must be an integer")
    if spec.kind is Kind.FRACTION:
        return _fraction(raw)
    if not isinstance(raw, str):
        raise _Invalid("must be a string")
    if spec.kind is Kind.PATH:
        if not raw.strip():
            raise _Invalid("must be a path")
        return base / Path(raw.strip()).expanduser()
    return raw.strip()


def _fraction(raw: object) -> float:
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise _Invalid("must be a number")
    try:
        value = float(raw)
    except ValueError:
        raise _Invalid("must be a number") from None
    if not math.isfinite(value):
        raise _Invalid("must be a finite number")
    return value


def _derive_embedding(
    values: dict[str, Any], shown: dict[str, _Origin], failed: set[str], errors: list[str]
) -> None:
    """Fill embedding.api, .model and .dimension when they were not given."""

    def fill(key: str, value: object) -> None:
        values[key] = value
        shown[key] = _Origin(value, "default")

    def pending(key: str) -> bool:
        return key not in failed and values.get(key) is None

    if pending("embedding.api") and "embedding.url" not in failed:
        fill("embedding.api", "local" if values["embedding.url"] is None else "tei")
    api = values.get("embedding.api")
    if pending("embedding.model") and api is not None:
        fill("embedding.model", LOCAL_MODEL if api == "local" else SERVER_MODEL)
    model = values.get("embedding.model")
    if pending("embedding.dimension") and model is not None:
        known = KNOWN_DIMENSIONS.get(model)
        if known is None:
            errors.append(
                "embedding.dimension: required for model"
                f" {_where(_BY_KEY['embedding.model'], shown['embedding.model'])}"
            )
        else:
            fill("embedding.dimension", known)


def _check(values: Mapping[str, Any], origins: Mapping[str, _Origin]) -> list[str]:
    """Every broken rule, one line each; keys missing from ``values`` are skipped."""
    errors: list[str] = []
    valid = dict(values)
    for spec in KEYS:
        value = values.get(spec.key)
        if value is None:
            continue
        problem: str | None = None
        if spec.bound is not None:
            problem = spec.bound.violation(value)
        elif spec.choices and value not in spec.choices:
            problem = f"must be one of {'|'.join(spec.choices)}"
        elif spec.kind is Kind.URL:
            problem = _url_problem(spec, value)
        if problem is not None:
            errors.append(_line(spec, problem, origins[spec.key]))
            # One line per mistake: rules between keys skip a value already reported.
            del valid[spec.key]
    errors.extend(_cross_checks(valid, origins))
    return errors


def _cross_checks(values: Mapping[str, Any], origins: Mapping[str, _Origin]) -> list[str]:
    """Rules between keys; each is reported on the first key of its pair."""
    errors: list[str] = []
    w = "indexing.worker."
    pairs: tuple[tuple[str, str, Callable[[Any, Any], bool], str], ...] = (
        (w + "lease-renewal-interval", "<", lambda a, b: a < b, w + "lease-duration"),
        (w + "heartbeat-timeout", ">", lambda a, b: a > b, w + "heartbeat-interval"),
        (w + "retry-backoff-max", ">=", lambda a, b: a >= b, w + "retry-backoff-initial"),
    )
    for key, relation, holds, other in pairs:
        mine, theirs = values.get(key), values.get(other)
        if mine is not None and theirs is not None and not holds(mine, theirs):
            errors.append(
                _line(
                    _BY_KEY[key],
                    f"must be {relation} {other} ({_where(_BY_KEY[other], origins[other])})",
                    origins[key],
                )
            )

    api, url = values.get("embedding.api"), values.get("embedding.url")
    if api in ("tei", "openai") and url is None and "embedding.url" in values:
        errors.append(
            f"embedding.url: required when embedding.api is {api}"
            f" ({_where(_BY_KEY['embedding.api'], origins['embedding.api'])})"
        )
    if api == "local" and url is not None:
        errors.append(
            _line(
                _BY_KEY["embedding.url"],
                "must be unset when embedding.api is local",
                origins["embedding.url"],
            )
        )

    model, dimension = values.get("embedding.model"), values.get("embedding.dimension")
    known = KNOWN_DIMENSIONS.get(model) if model is not None else None
    if known is not None and dimension is not None and dimension != known:
        errors.append(
            _line(
                _BY_KEY["embedding.dimension"],
                f"must be {known} for {model}",
                origins["embedding.dimension"],
            )
        )
    return errors


def _url_problem(spec: KeySpec, url: str) -> str | None:
    schemes = " or ".join(f"{scheme}://" for scheme in spec.schemes)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a malformed port
    except ValueError:
        return f"must be a {schemes} URL"
    if parts.scheme not in spec.schemes:
        return f"must be a {schemes} URL"
    if parts.scheme in ("http", "https", "s3") and not parts.hostname:
        return "must name a host"
    if parts.scheme == "s3":
        bucket = parts.path.strip("/")
        if not bucket or "/" in bucket:
            return "must name one bucket as its path (s3://host/bucket)"
        secure = dict(parse_qsl(parts.query)).get("secure", "true")
        if secure not in ("true", "false"):
            return "secure= must be true or false"
    if parts.scheme == "file" and (parts.netloc not in ("", "localhost") or not parts.path):
        return "must be file:///absolute/path"
    if parts.scheme in ("postgresql", "postgres"):
        # libpq's own parser: a bad %-escape would otherwise surface at connect time, quoted
        from trioindex.db.pool import conninfo_problem

        problem = conninfo_problem(url)
        if problem is not None:
            return f"must be a valid PostgreSQL URL ({problem})"
    return None


def _build(values: Mapping[str, Any]) -> Settings:
    top: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    for spec in KEYS:
        section, _, name = spec.field.rpartition(".")
        if section:
            sections.setdefault(section, {})[name] = values[spec.key]
        else:
            top[name] = values[spec.key]
    return Settings(
        database=DatabaseSettings(**sections["database"]),
        storage=StorageSettings(**sections["storage"]),
        embedding=EmbeddingSettings(**sections["embedding"]),
        worker=WorkerSettings(**sections["worker"]),
        parsing=ParsingSettings(**sections["parsing"]),
        **top,
    )


def _flatten_settings(settings: Settings) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for spec in KEYS:
        value: Any = settings
        for name in spec.field.split("."):
            value = getattr(value, name)
        values[spec.key] = value
    return values


def _with_overrides(settings: Settings, changes: Mapping[str, Any]) -> Settings:
    updates: dict[str, Any] = {}
    for name, change in changes.items():
        current: Any = getattr(settings, name, None)
        if attrs.has(type(current)) and isinstance(change, Mapping):
            updates[name] = attrs.evolve(current, **change)
        else:
            updates[name] = change
    updated = attrs.evolve(settings, **updates)
    before, after = _flatten_settings(settings), _flatten_settings(updated)
    origins = {
        spec.key: _Origin(
            f"{_number(after[spec.key])}s" if spec.kind is Kind.DURATION else after[spec.key],
            "override" if after[spec.key] != before[spec.key] else "settings",
        )
        for spec in KEYS
    }
    errors = _check(after, origins)
    if errors:
        raise ConfigError(_join(errors))
    return updated


# --------------------------------------------------------------------------------------------
# Messages


def _line(spec: KeySpec, problem: str, origin: _Origin) -> str:
    return f"{spec.key}: {problem}, got {_show_value(spec, origin.raw)} (from {origin.source})"


def _where(spec: KeySpec, origin: _Origin) -> str:
    """``5m from TRIOINDEX_...``: another key's value, for rules between keys."""
    value = _show_value(spec, origin.raw)
    return value if origin.source == "default" else f"{value} from {origin.source}"


def _join(errors: list[str]) -> str:
    if len(errors) == 1:
        return errors[0]
    return f"{len(errors)} configuration errors:\n" + "\n".join(f"  {e}" for e in errors)


def _show_value(spec: KeySpec, raw: object) -> str:
    # Every URL is redacted, not only the secret ones: credentials turn up in any of them.
    if isinstance(raw, str) and spec.kind is Kind.URL:
        return _show(redact_url(raw))
    return "<hidden>" if spec.secret else _show(raw)


def _show(raw: object) -> str:
    """A value as a person wrote it: bare when unambiguous, quoted otherwise."""
    if isinstance(raw, bool):
        return "true" if raw else "false"
    if isinstance(raw, int | float):
        return _number(raw)
    if isinstance(raw, str):
        return raw if re.fullmatch(r"[\w.:/@?=&%+*~<>-]+", raw) else repr(raw)
    if isinstance(raw, Path):
        return _show(str(raw))
    if isinstance(raw, dict):
        return "a table"
    if isinstance(raw, list):
        return "an array"
    return f"a {type(raw).__name__}"


def _number(value: float) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


_SECRET_PARAM = re.compile(r"pass|secret|key|token|credential", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` with its credentials and secret-looking query values replaced by ``***``.

    ``user:password@`` keeps the user; a lone ``token@`` is hidden whole. Safe for logs and
    messages. A URL whose credentials cannot be located becomes ``<redacted URL>``.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<redacted URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:***@{hostport}" if colon else f"***@{hostport}"
    elif "@" in url:
        # "u:pw@host" without "//" parses as scheme "u" and path "pw@host": hide it all.
        return "<redacted URL>"
    query = "&".join(
        f"{name}={'***' if _SECRET_PARAM.search(name) else value}"
        for name, value in parse_qsl(parts.query, keep_blank_values=True)
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


# --------------------------------------------------------------------------------------------
# Reference


def reference_markdown() -> str:
    """The table of every key, for README and docs (a test keeps the docs in step with it)."""
    rows = [
        "| Key | Environment variable | Type | Default | Rule | Meaning |",
        "|---|---|---|---|---|---|",
    ]
    for spec in KEYS:
        if isinstance(spec.default, Derived):
            default = spec.default.text
        elif spec.default is None:
            default = "(none)"
        else:
            default = f"`{spec.default}`"
        cells = (f"`{spec.key}`", f"`{spec.env}`", spec.kind.value, default, spec.rule, spec.doc)
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
