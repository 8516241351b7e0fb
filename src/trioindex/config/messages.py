"""How a configuration problem is reported: one line naming the key, the value and its source.

Every problem found while loading is collected and raised as one
:class:`~trioindex.errors.ConfigError`, one line per problem. Secrets (database URL password,
storage URL secret, embedding API key) are never shown: every URL goes through its key's
redaction (:func:`~trioindex.storage.urls.redact_url` unless the key names another) and a secret
key's value is ``<hidden>``.
"""

from __future__ import annotations

import attrs

from trioindex.config.key_spec import KeySpec, Kind
from trioindex.config.units import show


@attrs.frozen
class Origin:
    """Where a value came from and how the person wrote it (for error messages)."""

    raw: object
    source: str


def line(spec: KeySpec, problem: str, origin: Origin) -> str:
    """``key: problem, got value (from source)``."""
    return f"{spec.key}: {problem}, got {show_value(spec, origin.raw)} (from {origin.source})"


def where(spec: KeySpec, origin: Origin) -> str:
    """``5m from TRIOINDEX_...``: another key's value, for rules between keys."""
    value = show_value(spec, origin.raw)
    return value if origin.source == "default" else f"{value} from {origin.source}"


def join(errors: list[str]) -> str:
    """The text of the one error raised for every problem found."""
    if len(errors) == 1:
        return errors[0]
    return f"{len(errors)} configuration errors:\n" + "\n".join(f"  {e}" for e in errors)


def redact_url(url: str) -> str:
    """:func:`trioindex.storage.urls.redact_url`, imported when first used (the storage package
    loads Trio, which reading the settings does not need)."""
    from trioindex.storage.urls import redact_url as redact

    return redact(url)


def show_value(spec: KeySpec, raw: object) -> str:
    """``raw`` as written, safe to show for ``spec``."""
    # Every URL is redacted, not only the secret ones: credentials turn up in any of them.
    if isinstance(raw, str) and spec.kind is Kind.URL:
        return show((spec.redact or redact_url)(raw))
    return "<hidden>" if spec.secret else show(raw)
