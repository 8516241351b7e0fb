"""Configuration: the registry of keys, and loading, validating and documenting them.

Modules, in the order a value travels:

* ``home`` — where the home and the file are: the project above the working directory, or the
  user's data folder;
* ``settings`` — the validated values (:class:`Settings` and its sections) and model constants;
* ``key_spec`` — what a key is: its kind, bound, derived default and environment variable;
* ``keys`` — :data:`KEYS`, every key named once with its default, kind, rule and meaning;
* ``url_grammars`` — the URL keys' grammar and redaction, from the modules that read them;
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
from trioindex.config.home import CONFIG_FILENAME, ensure_home, find_project, user_data_home
from trioindex.config.key_spec import ENV_PREFIX, Bound, Derived, KeySpec, Kind, env_name
from trioindex.config.keys import EMBEDDING_APIS, KEYS, URL_APIS
from trioindex.config.loading import CONFIG_ENV, default_settings, load_settings
from trioindex.config.messages import redact_url
from trioindex.config.reference import reference_markdown
from trioindex.config.settings import (
    KNOWN_DIMENSIONS,
    LOCAL_MODEL,
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
from trioindex.config.units import parse_duration, parse_size

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
    "SearchSettings",
    "Settings",
    "StorageSettings",
    "WorkerSettings",
    "default_settings",
    "ensure_home",
    "env_name",
    "find_project",
    "load_settings",
    "parse_duration",
    "parse_size",
    "redact_url",
    "reference_markdown",
    "user_data_home",
    "value_problem",
]
