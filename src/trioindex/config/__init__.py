"""Configuration: the registry of keys, and loading, validating and documenting them.

Modules, in the order a value travels:

* ``settings`` — the validated values (:class:`Settings` and its sections) and model constants;
* ``keys`` — :data:`KEYS`, every key named once with its default, kind, rule and meaning;
* ``units`` — durations and sizes as people write them, and how a value is shown back;
* ``checks`` — each key's own rule and the rules between keys (URL keys use the grammar of
  the module that reads them: ``storage.url`` is :mod:`trioindex.storage.urls`);
* ``messages`` — one line per problem, naming key, value (secrets hidden) and source;
* ``loading`` — defaults < ``trioindex.toml`` < ``TRIOINDEX_*`` variables, to :class:`Settings`;
* ``reference`` — the generated table in README.md and docs/design/configuration.md.

docs/design/configuration.md describes the keys, the layers and the error format.
"""

from __future__ import annotations

from trioindex.config.checks import value_problem
from trioindex.config.keys import (
    EMBEDDING_APIS,
    ENV_PREFIX,
    KEYS,
    URL_APIS,
    Bound,
    Derived,
    KeySpec,
    Kind,
    env_name,
)
from trioindex.config.loading import CONFIG_ENV, CONFIG_FILENAME, default_settings, load_settings
from trioindex.config.reference import reference_markdown
from trioindex.config.settings import (
    KNOWN_DIMENSIONS,
    LOCAL_MODEL,
    SERVER_MODEL,
    DatabaseSettings,
    EmbeddingSettings,
    HttpSettings,
    ParsingSettings,
    Settings,
    StorageSettings,
    WorkerSettings,
)
from trioindex.config.units import parse_duration, parse_size
from trioindex.storage.urls import redact_url

__all__ = [
    "CONFIG_ENV",
    "CONFIG_FILENAME",
    "EMBEDDING_APIS",
    "ENV_PREFIX",
    "KEYS",
    "KNOWN_DIMENSIONS",
    "LOCAL_MODEL",
    "SERVER_MODEL",
    "URL_APIS",
    "Bound",
    "DatabaseSettings",
    "Derived",
    "EmbeddingSettings",
    "HttpSettings",
    "KeySpec",
    "Kind",
    "ParsingSettings",
    "Settings",
    "StorageSettings",
    "WorkerSettings",
    "default_settings",
    "env_name",
    "load_settings",
    "parse_duration",
    "parse_size",
    "redact_url",
    "reference_markdown",
    "value_problem",
]
