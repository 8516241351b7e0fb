"""Configuration: defaults, layering, validation messages, secrets and the reference table."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trioindex.config import (
    KEYS,
    DatabaseSettings,
    EmbeddingSettings,
    ParsingSettings,
    Settings,
    StorageSettings,
    WorkerSettings,
    default_settings,
    env_name,
    load_settings,
    parse_duration,
    parse_size,
    redact_url,
    reference_markdown,
)
from trioindex.errors import ConfigError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "design" / "configuration.md"


def load(tmp_path: Path, env: dict[str, str] | None = None, toml: str | None = None) -> Settings:
    if toml is not None:
        (tmp_path / "trioindex.toml").write_text(toml, encoding="utf-8")
    return load_settings(environ=env or {}, cwd=tmp_path)


def load_error(tmp_path: Path, env: dict[str, str] | None = None, toml: str | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, env, toml)
    return str(info.value)


# ---------------------------------------------------------------------------- defaults


def test_every_default(tmp_path: Path) -> None:
    settings = load(tmp_path, {"XDG_DATA_HOME": str(tmp_path / "data")})
    assert settings == Settings(
        home=tmp_path / "data" / "trioindex",
        database=DatabaseSettings(url=None, pool_size=8),
        storage=StorageSettings(url=None),
        embedding=EmbeddingSettings(
            api="local",
            url=None,
            model="sentence-transformers/all-MiniLM-L6-v2",
            dimension=384,
            api_key=None,
            batch_size=32,
            max_in_flight=8,
            request_timeout=60.0,
        ),
        worker=WorkerSettings(
            polling_interval=1.0,
            max_concurrency=2,
            lease_duration=300.0,
            lease_renewal_interval=60.0,
            shutdown_grace_period=30.0,
            heartbeat_interval=10.0,
            heartbeat_timeout=60.0,
            recovery_interval=30.0,
            max_attempts=5,
            retry_backoff_initial=10.0,
            retry_backoff_max=600.0,
            retry_jitter=0.2,
        ),
        parsing=ParsingSettings(
            max_document_bytes=50_000_000,
            timeout=300.0,
            chunk_max_tokens=256,
            chunk_max_characters=1500,
            chunk_overlap=0.1,
        ),
        log_format="text",
    )


def test_default_settings_ignores_environment_and_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRIOINDEX_WORKER_MAX_CONCURRENCY", "9")
    (tmp_path / "trioindex.toml").write_text("[database]\npool-size = 7\n")
    settings = default_settings()
    assert settings.worker.max_concurrency == 2
    assert settings.database.pool_size == 8
    assert settings.home == tmp_path / ".trioindex"


def test_concurrency_default_follows_the_embedder(tmp_path: Path) -> None:
    remote = load(tmp_path, {"TRIOINDEX_EMBEDDING_URL": "http://127.0.0.1:8080"})
    local = load(tmp_path, {})
    given = load(
        tmp_path,
        {
            "TRIOINDEX_EMBEDDING_URL": "http://127.0.0.1:8080",
            "TRIOINDEX_WORKER_MAX_CONCURRENCY": "3",
        },
    )
    assert (remote.worker.max_concurrency, local.worker.max_concurrency) == (256, 2)
    assert given.worker.max_concurrency == 3


def test_server_defaults_follow_embedding_url(tmp_path: Path) -> None:
    settings = load(tmp_path, {"TRIOINDEX_EMBEDDING_URL": "http://127.0.0.1:8080"})
    assert (settings.embedding.api, settings.embedding.model, settings.embedding.dimension) == (
        "tei",
        "BAAI/bge-m3",
        1024,
    )


def test_other_model_needs_dimension(tmp_path: Path) -> None:
    env = {
        "TRIOINDEX_EMBEDDING_API": "openai",
        "TRIOINDEX_EMBEDDING_URL": "https://embed.example/v1",
        "TRIOINDEX_EMBEDDING_MODEL": "text-embedding-3-small",
    }
    message = load_error(tmp_path, env)
    assert message == (
        "embedding.dimension: required for model text-embedding-3-small"
        " from TRIOINDEX_EMBEDDING_MODEL"
    )
    settings = load(tmp_path, {**env, "TRIOINDEX_EMBEDDING_DIMENSION": "1536"})
    assert settings.embedding.api == "openai"
    assert settings.embedding.dimension == 1536


# ---------------------------------------------------------------------------- registry


def test_env_names_follow_the_rule() -> None:
    assert env_name("indexing.worker.polling-interval") == "TRIOINDEX_WORKER_POLLING_INTERVAL"
    assert env_name("database.url") == "TRIOINDEX_DATABASE_URL"
    assert env_name("embedding.api") == "TRIOINDEX_EMBEDDING_API"
    assert env_name("home") == "TRIOINDEX_HOME"
    for spec in KEYS:
        assert spec.env == env_name(spec.key)
    assert len({spec.env for spec in KEYS}) == len(KEYS)
    assert len({spec.key for spec in KEYS}) == len(KEYS)


def test_registry_covers_every_settings_field_once() -> None:
    leaves = {
        f"{outer.name}.{inner.name}" if attrs.has(outer.type) else outer.name
        for outer in attrs.fields(attrs.resolve_types(Settings))
        for inner in (attrs.fields(outer.type) if attrs.has(outer.type) else [outer])
    }
    assert sorted(spec.field for spec in KEYS) == sorted(leaves)


def test_every_key_is_settable_from_the_environment(tmp_path: Path) -> None:
    # One non-default valid value per key, all at once, each read back from its field.
    values = {
        "home": ("/srv/ti", Path("/srv/ti")),
        "database.url": ("postgresql://u:pw@db:5432/ti", "postgresql://u:pw@db:5432/ti"),
        "database.pool-size": ("9", 9),
        "database.pool-max-idle": ("3s", 3.0),
        "database.pooler": ("transaction", "transaction"),
        "database.direct-url": ("postgresql://u:pw@pg:5432/ti", "postgresql://u:pw@pg:5432/ti"),
        "storage.url": (
            "s3://K:S@minio:9000/docs?secure=false",
            "s3://K:S@minio:9000/docs?secure=false",
        ),
        "embedding.api": ("openai", "openai"),
        "embedding.url": ("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1"),
        "embedding.model": ("m", "m"),
        "embedding.dimension": ("3", 3),
        "embedding.api-key": ("sk-1", "sk-1"),
        "embedding.batch-size": ("5", 5),
        "embedding.max-in-flight": ("6", 6),
        "embedding.index-min-vectors": ("0", 0),
        "embedding.request-timeout": ("1500ms", 1.5),
        "indexing.worker.polling-interval": ("250ms", 0.25),
        "indexing.worker.max-concurrency": ("3", 3),
        "indexing.worker.lease-duration": ("2m", 120.0),
        "indexing.worker.lease-renewal-interval": ("20s", 20.0),
        "indexing.worker.shutdown-grace-period": ("0s", 0.0),
        "indexing.worker.heartbeat-interval": ("2s", 2.0),
        "indexing.worker.heartbeat-timeout": ("7s", 7.0),
        "indexing.worker.recovery-interval": ("1h", 3600.0),
        "indexing.worker.max-attempts": ("1", 1),
        "indexing.worker.retry-backoff-initial": ("1s", 1.0),
        "indexing.worker.retry-backoff-max": ("1s", 1.0),
        "indexing.worker.retry-jitter": ("0", 0.0),
        "indexing.parsing.max-document-size": ("512KiB", 524288),
        "indexing.parsing.timeout": ("90s", 90.0),
        "indexing.parsing.ocr": ("off", "off"),
        "indexing.parsing.ocr-low-confidence": ("75", 75.0),
        "indexing.chunking.max-tokens": ("8", 8),
        "indexing.chunking.max-characters": ("50", 50),
        "indexing.chunking.overlap": ("0.25", 0.25),
        "log.format": ("json", "json"),
        "http.webhook-token": ("hook-1", "hook-1"),
        "http.max-concurrent-requests": ("3", 3),
        "search.bm25-k1": ("0.9", 0.9),
        "search.bm25-b": ("0.4", 0.4),
        "search.rerank-url": ("http://127.0.0.1:9", "http://127.0.0.1:9"),
        "search.rerank-top-n": ("7", 7),
        "search.rerank-timeout": ("500ms", 0.5),
    }
    assert set(values) == {spec.key for spec in KEYS}
    env = {env_name(key): text for key, (text, _) in values.items()}
    settings = load(tmp_path, env)
    for spec in KEYS:
        got: object = settings
        for name in spec.field.split("."):
            got = getattr(got, name)
        assert got == values[spec.key][1], spec.key


# ---------------------------------------------------------------------------- layering


def test_file_values_are_read(tmp_path: Path) -> None:
    settings = load(
        tmp_path,
        toml="""
home = "data"
[indexing.worker]
polling-interval = "500ms"
shutdown-grace-period = 45          # plain integer seconds
[indexing.parsing]
max-document-size = 1048576
[log]
format = "json"
""",
    )
    assert settings.home == tmp_path / "data"
    assert settings.worker.polling_interval == 0.5
    assert settings.worker.shutdown_grace_period == 45.0
    assert settings.parsing.max_document_bytes == 1048576
    assert settings.log_format == "json"


def test_dotted_keys_in_the_file(tmp_path: Path) -> None:
    settings = load(tmp_path, toml="indexing.worker.max-concurrency = 6\ndatabase.pool-size = 2\n")
    assert (settings.worker.max_concurrency, settings.database.pool_size) == (6, 2)


def test_environment_overrides_file_overrides_default(tmp_path: Path) -> None:
    toml = "[indexing.worker]\nmax-concurrency = 4\npolling-interval = '3s'\n"
    settings = load(tmp_path, {"TRIOINDEX_WORKER_MAX_CONCURRENCY": "8"}, toml)
    assert settings.worker.max_concurrency == 8  # env over file
    assert settings.worker.polling_interval == 3.0  # file over default
    assert settings.worker.lease_duration == 300.0  # default


def test_empty_variable_unsets_an_optional_file_value(tmp_path: Path) -> None:
    toml = '[database]\nurl = "postgresql://db/ti"\n'
    assert load(tmp_path, toml=toml).database.url == "postgresql://db/ti"
    assert load(tmp_path, {"TRIOINDEX_DATABASE_URL": ""}).database.url is None


def test_trioindex_config_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "trioindex.toml").write_text("[database]\npool-size = 2\n")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "prod.toml").write_text("[database]\npool-size = 12\n")
    relative = load(tmp_path, {"TRIOINDEX_CONFIG": "conf/prod.toml"})
    absolute = load(tmp_path, {"TRIOINDEX_CONFIG": str(tmp_path / "conf" / "prod.toml")})
    assert relative.database.pool_size == absolute.database.pool_size == 12


def test_missing_named_file_is_an_error(tmp_path: Path) -> None:
    message = load_error(tmp_path, {"TRIOINDEX_CONFIG": "nope.toml"})
    assert message == "TRIOINDEX_CONFIG: no such file, got nope.toml"


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    message = load_error(tmp_path, toml="[database\nurl = 'postgresql://u:hunter2@h/db'\n")
    assert message.startswith(f"{tmp_path / 'trioindex.toml'}: invalid TOML")
    assert "hunter2" not in message


def test_unknown_keys_are_errors(tmp_path: Path) -> None:
    message = load_error(
        tmp_path,
        toml="""
colour = "blue"
[indexing.worker]
polling-intervall = "1s"
[database]
password = "hunter2"
""",
    )
    lines = message.splitlines()
    assert lines[0] == "3 configuration errors:"
    assert f"  colour: unknown key (in {tmp_path / 'trioindex.toml'})" in lines
    assert any(
        line.startswith("  indexing.worker.polling-intervall: unknown key")
        and "did you mean indexing.worker.polling-interval?" in line
        for line in lines
    )
    assert any(line.startswith("  database.password: unknown key") for line in lines)
    assert "hunter2" not in message


def test_table_where_a_value_belongs(tmp_path: Path) -> None:
    message = load_error(tmp_path, toml="[home]\npath = 'x'\n")
    assert message == f"home: expected a value, got a table (from {tmp_path / 'trioindex.toml'})"


def test_unknown_variables_are_logged_by_name_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = {
        "TRIOINDEX_WORKER_MAX_CONCURENCY": "hunter2",
        "TRIOINDEX_TEST_DATABASE_URL": "postgresql://x",
        "TRIOINDEX_CONFIG": "",
    }
    with caplog.at_level(logging.WARNING, logger="trioindex.config"):
        load(tmp_path, env)
    assert [r.getMessage() for r in caplog.records] == [
        "ignoring unknown environment variable TRIOINDEX_WORKER_MAX_CONCURENCY"
    ]


# ---------------------------------------------------------------------------- validation

W = "indexing.worker."
INVALID = [
    # (key, value as written, problem)
    (W + "polling-interval", "0s", "must be > 0"),
    (W + "polling-interval", "-1s", "must be a duration such as 500ms, 30s, 5m or 1h"),
    (W + "max-concurrency", "0", "must be >= 1"),
    (W + "max-concurrency", "two", "must be an integer"),
    (W + "max-concurrency", "2.5", "must be an integer"),
    (W + "lease-duration", "0ms", "must be > 0"),
    (W + "lease-renewal-interval", "0s", "must be > 0"),
    (W + "shutdown-grace-period", "soon", "must be a duration such as 500ms, 30s, 5m or 1h"),
    (W + "heartbeat-interval", "0s", "must be > 0"),
    (W + "recovery-interval", "0h", "must be > 0"),
    (W + "max-attempts", "0", "must be >= 1"),
    (W + "retry-backoff-initial", "0s", "must be > 0"),
    (W + "retry-jitter", "1.5", "must be >= 0 and <= 1"),
    (W + "retry-jitter", "-0.1", "must be >= 0 and <= 1"),
    (W + "retry-jitter", "nan", "must be a finite number"),
    ("database.pool-size", "0", "must be >= 1"),
    ("embedding.batch-size", "0", "must be >= 1"),
    ("embedding.max-in-flight", "-3", "must be >= 1"),
    ("embedding.request-timeout", "0s", "must be > 0"),
    ("embedding.api", "grpc", "must be one of tei|openai|local"),
    ("embedding.url", "ftp://h/x", "must be a http:// or https:// URL"),
    ("embedding.url", "http:///v1", "must name a host"),
    ("embedding.dimension", "0", "must be >= 1"),
    ("storage.url", "gs://bucket", "must be a s3:// or file:// URL"),
    ("storage.url", "s3://minio:9000", "must name one bucket as its path (s3://host/bucket)"),
    ("storage.url", "s3://minio:9000/b?secure=no", "secure= must be true or false"),
    ("storage.url", "file://relative/dir", "must be file:///absolute/path"),
    ("indexing.parsing.max-document-size", "0", "must be >= 1"),
    ("indexing.parsing.max-document-size", "50XB", "must be a size such as 50MB"),
    ("indexing.parsing.timeout", "0s", "must be > 0"),
    ("indexing.parsing.timeout", "forever", "must be a duration such as 500ms, 30s, 5m or 1h"),
    ("indexing.chunking.max-tokens", "7", "must be >= 8"),
    ("indexing.chunking.max-characters", "49", "must be >= 50"),
    ("indexing.chunking.overlap", "0.5", "must be >= 0 and < 0.5"),
    ("log.format", "xml", "must be one of text|json"),
    ("log.format", "", "must be one of text|json"),
]


@pytest.mark.parametrize(("key", "text", "problem"), INVALID)
def test_invalid_value_from_environment(tmp_path: Path, key: str, text: str, problem: str) -> None:
    env = {env_name(key): text}
    if key == "embedding.url":
        env["TRIOINDEX_EMBEDDING_API"] = "tei"
    message = load_error(tmp_path, env)
    shown = text if re.fullmatch(r"[\w.:/@?=&%+*~<>-]+", text) else repr(text)
    assert message.startswith(f"{key}: {problem}")
    assert message.endswith(f", got {shown} (from {env_name(key)})")
    assert "\n" not in message


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("max-concurrency = 0", "must be >= 1, got 0"),
        ("max-concurrency = true", "must be an integer, got true"),
        ("max-concurrency = 2.0", "must be an integer, got 2"),
        ("polling-interval = -1", "must be a non-negative number of seconds, got -1"),
        ("polling-interval = [1]", "must be a duration such as 500ms, 30s, 5m or 1h, got an array"),
        ("retry-jitter = 'lots'", "must be a number, got lots"),
    ],
)
def test_invalid_value_from_file(tmp_path: Path, line: str, expected: str) -> None:
    message = load_error(tmp_path, toml=f"[indexing.worker]\n{line}\n")
    key = W + line.split(" =", maxsplit=1)[0]
    assert message == f"{key}: {expected} (from {tmp_path / 'trioindex.toml'})"


def test_the_brief_example_message(tmp_path: Path) -> None:
    assert load_error(tmp_path, {"TRIOINDEX_WORKER_MAX_CONCURRENCY": "0"}) == (
        "indexing.worker.max-concurrency: must be >= 1, got 0"
        " (from TRIOINDEX_WORKER_MAX_CONCURRENCY)"
    )


def test_renewal_must_be_shorter_than_lease(tmp_path: Path) -> None:
    message = load_error(
        tmp_path,
        {"TRIOINDEX_WORKER_LEASE_RENEWAL_INTERVAL": "5m"},
        toml="[indexing.worker]\nlease-duration = '5m'\n",
    )
    assert message == (
        "indexing.worker.lease-renewal-interval: must be < indexing.worker.lease-duration"
        f" (5m from {tmp_path / 'trioindex.toml'}), got 5m"
        " (from TRIOINDEX_WORKER_LEASE_RENEWAL_INTERVAL)"
    )


def test_heartbeat_timeout_must_exceed_interval(tmp_path: Path) -> None:
    message = load_error(tmp_path, {"TRIOINDEX_WORKER_HEARTBEAT_TIMEOUT": "10s"})
    assert message == (
        "indexing.worker.heartbeat-timeout: must be > indexing.worker.heartbeat-interval (10s),"
        " got 10s (from TRIOINDEX_WORKER_HEARTBEAT_TIMEOUT)"
    )


def test_backoff_max_must_reach_initial(tmp_path: Path) -> None:
    message = load_error(tmp_path, {"TRIOINDEX_WORKER_RETRY_BACKOFF_MAX": "5s"})
    assert message.startswith(
        "indexing.worker.retry-backoff-max: must be >= indexing.worker.retry-backoff-initial (10s)"
    )


def test_embedding_server_needs_url_and_local_refuses_one(tmp_path: Path) -> None:
    assert load_error(tmp_path, {"TRIOINDEX_EMBEDDING_API": "tei"}) == (
        "embedding.url: required when embedding.api is tei (tei from TRIOINDEX_EMBEDDING_API)"
    )
    env = {"TRIOINDEX_EMBEDDING_API": "local", "TRIOINDEX_EMBEDDING_URL": "http://h:1"}
    assert load_error(tmp_path, env) == (
        "embedding.url: must be unset when embedding.api is local, got http://h:1"
        " (from TRIOINDEX_EMBEDDING_URL)"
    )


def test_known_model_dimension_must_match(tmp_path: Path) -> None:
    env = {"TRIOINDEX_EMBEDDING_URL": "http://h:1", "TRIOINDEX_EMBEDDING_DIMENSION": "768"}
    assert load_error(tmp_path, env) == (
        "embedding.dimension: must be 1024 for BAAI/bge-m3, got 768"
        " (from TRIOINDEX_EMBEDDING_DIMENSION)"
    )


def test_all_errors_are_reported_together(tmp_path: Path) -> None:
    message = load_error(
        tmp_path,
        {
            "TRIOINDEX_WORKER_POLLING_INTERVAL": "1x",
            "TRIOINDEX_WORKER_MAX_CONCURRENCY": "0",
            "TRIOINDEX_LOG_FORMAT": "xml",
        },
        toml="[indexing.worker]\nshutdown-grace-period = -5\nlease-renewal-interval = '6m'\n",
    )
    lines = message.splitlines()
    assert lines[0] == "5 configuration errors:"
    # One line each, in registry order.
    assert [line.split(":")[0].strip() for line in lines[1:]] == [
        W + "polling-interval",
        W + "max-concurrency",
        W + "lease-renewal-interval",
        W + "shutdown-grace-period",
        "log.format",
    ]


# ---------------------------------------------------------------------------- secrets

SECRETS = {
    "TRIOINDEX_DATABASE_URL": "postgresql://ti:hunter2@db:5432/ti?sslpassword=pem-s3cret",
    "TRIOINDEX_STORAGE_URL": "s3://AKIA:wJalrXUtnFEMI@minio:9000/docs",
    "TRIOINDEX_EMBEDDING_API_KEY": "sk-live-abcdef",
}
SECRET_TEXT = ("hunter2", "pem-s3cret", "wJalrXUtnFEMI", "sk-live-abcdef")


def test_secrets_are_not_in_repr(tmp_path: Path) -> None:
    settings = load(tmp_path, SECRETS)
    assert settings.database.url == SECRETS["TRIOINDEX_DATABASE_URL"]
    assert settings.embedding.api_key == "sk-live-abcdef"
    for text in (repr(settings), str(settings), repr(settings.database), repr(settings.storage)):
        for secret in SECRET_TEXT:
            assert secret not in text


def test_secrets_are_not_in_error_messages(tmp_path: Path) -> None:
    message = load_error(
        tmp_path,
        {
            "TRIOINDEX_DATABASE_URL": "mysql://u:hunter2@h/db",
            "TRIOINDEX_STORAGE_URL": "s3://AKIA:wJalrXUtnFEMI@minio:9000/",
            "TRIOINDEX_WORKER_MAX_CONCURRENCY": "0",
        },
        toml="[embedding]\napi-key = 12345\n",
    )
    assert (
        "database.url: must be a postgresql:// URL or a key=value connection string,"
        " got mysql://u:***@h/db" in message
    )
    assert "storage.url: must name one bucket" in message
    assert "got s3://AKIA:***@minio:9000/" in message
    assert "embedding.api-key: must be a string, got <hidden>" in message
    for secret in (*SECRET_TEXT, "12345"):
        assert secret not in message


def test_secrets_are_not_in_cross_key_messages(tmp_path: Path) -> None:
    env = {"TRIOINDEX_EMBEDDING_URL": "http://tok3n@h:1", "TRIOINDEX_EMBEDDING_API": "local"}
    message = load_error(tmp_path, env)
    assert "tok3n" not in message
    assert "got http://***@h:1" in message


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("postgresql://u:hunter2@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgresql://u:p@ss@h/db", "postgresql://u:***@h/db"),
        ("https://token@h/v1", "https://***@h/v1"),
        (
            "postgresql://h/db?user=u&password=pw&sslmode=require",
            "postgresql://h/db?user=u&password=***&sslmode=require",
        ),
        ("s3://K:S@[::1]:9000/b?secure=false", "s3://K:***@[::1]:9000/b?secure=false"),
        ("u:hunter2@h/db", "<redacted URL>"),
        ("file:///srv/blobs", "file:///srv/blobs"),
    ],
)
def test_redact_url(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted


# ---------------------------------------------------------------------------- overrides


def test_overrides_take_sections_or_mappings(tmp_path: Path) -> None:
    base = default_settings(home=tmp_path)
    changed = base.with_overrides(worker={"max_concurrency": 7}, log_format="json")
    assert changed.worker.max_concurrency == 7
    assert changed.worker.lease_duration == base.worker.lease_duration
    assert changed.log_format == "json"
    assert changed.home == tmp_path
    whole = default_settings(database=DatabaseSettings(url="postgresql://db/ti", pool_size=1))
    assert whole.database.pool_size == 1


def test_overrides_are_validated() -> None:
    with pytest.raises(ConfigError) as info:
        default_settings(worker={"lease_renewal_interval": 600.0, "max_concurrency": 0})
    assert str(info.value).splitlines() == [
        "2 configuration errors:",
        "  indexing.worker.max-concurrency: must be >= 1, got 0 (from override)",
        "  indexing.worker.lease-renewal-interval: must be < indexing.worker.lease-duration"
        " (300s from settings), got 600s (from override)",
    ]


# ---------------------------------------------------------------------------- durations, sizes


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("1s", 1.0),
        ("1m", 60.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1.5s", 1.5),
        ("0s", 0.0),
        (" 30s ", 30.0),
        ("10 s", 10.0),
        (45, 45.0),
        (0.25, 0.25),
    ],
)
def test_parse_duration(text: str | int | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    [
        "",
        "-1s",
        "1x",
        "1.5.s",
        "s",
        "1",
        "500",
        "1S",
        ".5s",
        "1s2",
        "1h30m",
        -1,
        float("inf"),
        True,
    ],
)
def test_parse_duration_rejects(text: str | int | float) -> None:
    with pytest.raises(ValueError, match="got"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("50MB", 50_000_000),
        ("512KiB", 524_288),
        ("1048576", 1_048_576),
        ("1.5KB", 1500),
        ("2GiB", 2 * 1024**3),
        ("10kb", 10_000),
        ("7B", 7),
        ("8 MiB", 8 * 1024**2),
        (0, 0),
        (123, 123),
    ],
)
def test_parse_size(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "-1", "1.5B", "0.1", "5XB", "MB", "1.2.3MB", -5, False])
def test_parse_size_rejects(text: str | int) -> None:
    with pytest.raises(ValueError, match="got"):
        parse_size(text)


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["ms", "s", "m", "h"]))
def test_parse_duration_scales_whole_numbers(number: int, unit: str) -> None:
    factor = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    assert parse_duration(f"{number}{unit}") == pytest.approx(number * factor)


# ---------------------------------------------------------------------------- reference


def test_reference_table_has_one_row_per_key() -> None:
    table = reference_markdown()
    rows = table.splitlines()
    assert len(rows) == len(KEYS) + 2
    for spec, row in zip(KEYS, rows[2:], strict=True):
        assert row.startswith(f"| `{spec.key}` | `{spec.env}` |")
        # A literal pipe would split the row; choices are escaped.
        assert row.count("|") - row.count("\\|") == 7


def test_docs_contain_the_reference_verbatim() -> None:
    assert reference_markdown() in DOCS.read_text(encoding="utf-8"), (
        "docs/design/configuration.md is out of date: paste `python -m trioindex.config` output"
    )
