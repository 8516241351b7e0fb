"""Loading: from defaults, the TOML file and the environment to validated :class:`Settings`.

Values come from three layers, later ones winning::

    defaults  <  trioindex.toml (or the file named by TRIOINDEX_CONFIG)  <  TRIOINDEX_* variables

The file is the project's (:mod:`trioindex.config.home`: the nearest ``trioindex.toml`` at or
above the working directory), and so is the default home; a relative ``home`` in the file starts
at the file's folder, one from the environment at the working directory.

Each value keeps its :class:`~trioindex.config.messages.Origin` so that every problem found is
reported with the key, the value and where it came from, all in one
:class:`~trioindex.errors.ConfigError` (:mod:`trioindex.config.messages`). The same validation
runs on :meth:`Settings.with_overrides` copies.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from trioindex.config.checks import check
from trioindex.config.home import CONFIG_FILENAME, default_home, find_project
from trioindex.config.key_spec import ENV_PREFIX, Derived, KeySpec, Kind
from trioindex.config.keys import BY_KEY, KEYS
from trioindex.config.messages import Origin, join, line, where
from trioindex.config.settings import (
    KNOWN_DIMENSIONS,
    LOCAL_CONCURRENCY,
    LOCAL_MODEL,
    REMOTE_CONCURRENCY,
    SERVER_MODEL,
    DatabaseSettings,
    EmbeddingSettings,
    HttpSettings,
    ParsingSettings,
    SearchSettings,
    Settings,
    StorageSettings,
    WorkerSettings,
)
from trioindex.config.units import (
    Invalid,
    format_number,
    read_duration,
    read_size,
    show,
    text_problem,
)
from trioindex.errors import ConfigError

# The package's name, not this module's: operators and tests filter on "trioindex.config".
logger = logging.getLogger("trioindex.config")

CONFIG_ENV: Final = "TRIOINDEX_CONFIG"


def load_settings(*, environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> Settings:
    """Settings from defaults, the TOML file and ``TRIOINDEX_*`` variables, validated.

    ``environ`` defaults to ``os.environ``, ``cwd`` to the working directory. The file is
    ``$TRIOINDEX_CONFIG`` (relative to ``cwd``; it must exist) or the project's
    ``trioindex.toml`` (:func:`~trioindex.config.home.find_project`). Raises
    :class:`ConfigError` listing every problem found.
    """
    env = os.environ if environ is None else environ
    base = Path.cwd() if cwd is None else cwd
    errors: list[str] = []
    origins: dict[str, Origin] = {}

    path = _config_path(env, base, errors)
    if path is not None:
        origins.update(_read_file(path, errors))
    for spec in KEYS:
        if spec.env in env:
            origins[spec.key] = Origin(env[spec.env], spec.env)
    _warn_unknown_env(env)

    home = default_home(base, env)
    settings = _resolve(origins, base, errors, home_default=home, file=path)
    if errors or settings is None:
        # Registry order reads like the file; file-level problems come first.
        rank = {spec.key: n for n, spec in enumerate(KEYS)}
        errors.sort(key=lambda line: rank.get(line.split(":", 1)[0], -1))
        raise ConfigError(join(errors))
    logger.debug("configuration loaded (file: %s)", path or "none")
    return settings


def default_settings(**overrides: Any) -> Settings:
    """The defaults (no file, no environment), with ``overrides`` as in ``with_overrides``."""
    errors: list[str] = []
    cwd = Path.cwd()
    settings = _resolve({}, cwd, errors, home_default=default_home(cwd, os.environ))
    # The registry's own defaults are valid; a failure here is a bug in KEYS.
    assert settings is not None and not errors, errors
    return apply_overrides(settings, overrides) if overrides else settings


def _config_path(env: Mapping[str, str], base: Path, errors: list[str]) -> Path | None:
    named = env.get(CONFIG_ENV, "")
    if named:
        path = base / Path(named).expanduser()
        if not path.is_file():
            errors.append(f"{CONFIG_ENV}: no such file, got {show(named)}")
            return None
        return path
    project = find_project(base)
    default = None if project is None else project / CONFIG_FILENAME
    return default if default is not None and default.is_file() else None


def _read_file(path: Path, errors: list[str]) -> dict[str, Origin]:
    try:
        data = path.read_bytes()
        document = tomllib.loads(data.decode("utf-8"))
    except OSError as exc:
        errors.append(f"{path}: cannot read: {exc.strerror}")
        return {}
    except UnicodeDecodeError as exc:
        # TOML is UTF-8; say where the first other byte is, not what is around it.
        line_no = data.count(b"\n", 0, exc.start) + 1
        errors.append(f"{path}: not UTF-8 text (line {line_no}); TOML files must be UTF-8")
        return {}
    except tomllib.TOMLDecodeError as exc:
        # tomllib's messages give a position, never the offending text (which may be a secret).
        errors.append(f"{path}: invalid TOML: {exc}")
        return {}
    origins: dict[str, Origin] = {}
    for key, value in _flatten_table(document):
        if key in BY_KEY:
            if isinstance(value, dict):
                errors.append(f"{key}: expected a value, got a table (from {path})")
            else:
                origins[key] = Origin(value, str(path))
        else:
            errors.append(_unknown_key(key, path))
    return origins


def _flatten_table(table: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    pairs: list[tuple[str, Any]] = []
    for name, value in table.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict) and key not in BY_KEY:
            pairs.extend(_flatten_table(value, key + "."))
        else:
            pairs.append((key, value))
    return pairs


def _unknown_key(key: str, path: Path) -> str:
    close = difflib.get_close_matches(key, list(BY_KEY), n=1)
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


def _resolve(
    origins: Mapping[str, Origin],
    base: Path,
    errors: list[str],
    *,
    home_default: Path,
    file: Path | None = None,
) -> Settings | None:
    """Parse every key, fill the derived defaults, check the rules, build the settings.

    A relative path from ``file`` starts at the file's folder, any other at ``base``.

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
            origin = shown[spec.key] = Origin(spec.default, "default")
        root = file.parent if file is not None and origin.source == str(file) else base
        try:
            values[spec.key] = _parse(spec, origin.raw, root)
        except Invalid as exc:
            errors.append(line(spec, str(exc), origin))
            failed.add(spec.key)
    if values.get("home") is None and "home" not in failed:
        values["home"] = home_default
        shown["home"] = Origin(str(home_default), "default")
    _derive_embedding(values, shown, failed, errors)
    errors.extend(check(values, shown))
    return None if errors else _build(values)


def _parse(spec: KeySpec, raw: object, base: Path) -> object:
    optional = spec.default is None or isinstance(spec.default, Derived)
    if optional and (raw is None or (isinstance(raw, str) and not raw.strip())):
        # An empty variable (TRIOINDEX_DATABASE_URL=) unsets the key, also over the file.
        return None
    if spec.kind is Kind.DURATION:
        return read_duration(raw)
    if spec.kind is Kind.SIZE:
        return read_size(raw)
    if spec.kind is Kind.INT:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and re.fullmatch(r"\s*[+-]?\d+\s*", raw):
            return int(raw)
        raise Invalid("must be an integer")
    if spec.kind is Kind.FRACTION:
        return _fraction(raw)
    if not isinstance(raw, str):
        raise Invalid("must be a string")
    problem = None if spec.kind is Kind.PATH else text_problem(raw)  # a path may be any bytes
    if problem is not None:
        raise Invalid(problem)
    if spec.kind is Kind.PATH:
        if not raw.strip():
            raise Invalid("must be a path")
        return base / Path(raw.strip()).expanduser()
    return raw.strip()


def _fraction(raw: object) -> float:
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise Invalid("must be a number")
    try:
        value = float(raw)
    except ValueError:
        raise Invalid("must be a number") from None
    if not math.isfinite(value):
        raise Invalid("must be a finite number")
    return value


def _derive_embedding(
    values: dict[str, Any], shown: dict[str, Origin], failed: set[str], errors: list[str]
) -> None:
    """Fill embedding.api, .model and .dimension, and indexing.worker.max-concurrency, when
    they were not given."""

    def fill(key: str, value: object) -> None:
        values[key] = value
        shown[key] = Origin(value, "default")

    def pending(key: str) -> bool:
        return key not in failed and values.get(key) is None

    if pending("embedding.api") and "embedding.url" not in failed:
        fill("embedding.api", "local" if values["embedding.url"] is None else "tei")
    api = values.get("embedding.api")
    if pending("indexing.worker.max-concurrency") and api is not None:
        fill(
            "indexing.worker.max-concurrency",
            LOCAL_CONCURRENCY if api == "local" else REMOTE_CONCURRENCY,
        )
    if pending("embedding.model") and api is not None:
        fill("embedding.model", LOCAL_MODEL if api == "local" else SERVER_MODEL)
    model = values.get("embedding.model")
    if pending("embedding.dimension") and model is not None:
        known = KNOWN_DIMENSIONS.get(model)
        if known is None:
            errors.append(
                "embedding.dimension: required for model"
                f" {where(BY_KEY['embedding.model'], shown['embedding.model'])}"
            )
        else:
            fill("embedding.dimension", known)


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
        http=HttpSettings(**sections["http"]),
        search=SearchSettings(**sections["search"]),
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


def apply_overrides(settings: Settings, changes: Mapping[str, Any]) -> Settings:
    """``settings`` with ``changes`` applied and validated (see :meth:`Settings.with_overrides`)."""
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
        spec.key: Origin(
            f"{format_number(after[spec.key])}s" if spec.kind is Kind.DURATION else after[spec.key],
            "override" if after[spec.key] != before[spec.key] else "settings",
        )
        for spec in KEYS
    }
    errors = check(after, origins)
    if errors:
        raise ConfigError(join(errors))
    return updated
