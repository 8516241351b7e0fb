"""The rules a parsed value must meet: one key at a time, then the rules between keys.

:func:`value_problem` is the one definition of each key's own rule (the registry's bound,
choices or URL grammar); the embedding client applies it to values it is given directly, so a
value configuration refuses is refused there in the same words. :func:`check` runs every rule
over a set of values and reports each broken one as a message line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast
from urllib.parse import urlsplit

from trioindex.config.key_spec import KeySpec, Kind
from trioindex.config.keys import BY_KEY, URL_APIS
from trioindex.config.messages import Origin, line, where
from trioindex.config.settings import KNOWN_DIMENSIONS


def value_problem(key: str, value: object) -> str | None:
    """The rule of ``key`` that ``value`` (already parsed, not None) breaks, or None."""
    spec = BY_KEY[key]
    if spec.bound is not None:
        return spec.bound.violation(cast(float, value))
    if spec.choices:
        return None if value in spec.choices else f"must be one of {'|'.join(spec.choices)}"
    if spec.kind is Kind.URL:
        url = cast(str, value)
        return spec.grammar(url) if spec.grammar is not None else _url_problem(spec, url)
    text = value if isinstance(value, str) else ""
    if spec.kind is Kind.TEXT and not text.strip():
        return "must not be empty"
    if spec.max_chars is not None and len(text) > spec.max_chars:
        return f"must be at most {spec.max_chars} characters"
    if spec.kind is Kind.SECRET and not (text.isascii() and text.isprintable()):
        return "must be printable ASCII (it is sent in an HTTP header)"
    return None


def check(values: Mapping[str, Any], origins: Mapping[str, Origin]) -> list[str]:
    """Every broken rule, one line each; keys missing from ``values`` are skipped."""
    errors: list[str] = []
    valid = dict(values)
    for spec in BY_KEY.values():
        value = values.get(spec.key)
        if value is None:
            continue
        problem = value_problem(spec.key, value)
        if problem is not None:
            errors.append(line(spec, problem, origins[spec.key]))
            # One line per mistake: rules between keys skip a value already reported.
            del valid[spec.key]
    errors.extend(cross_checks(valid, origins))
    return errors


def cross_checks(values: Mapping[str, Any], origins: Mapping[str, Origin]) -> list[str]:
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
                line(
                    BY_KEY[key],
                    f"must be {relation} {other} ({where(BY_KEY[other], origins[other])})",
                    origins[key],
                )
            )

    api, url = values.get("embedding.api"), values.get("embedding.url")
    if api in URL_APIS and url is None and "embedding.url" in values:
        errors.append(
            f"embedding.url: required when embedding.api is {api}"
            f" ({where(BY_KEY['embedding.api'], origins['embedding.api'])})"
        )
    if api == "local" and url is not None:
        errors.append(
            line(
                BY_KEY["embedding.url"],
                "must be unset when embedding.api is local",
                origins["embedding.url"],
            )
        )

    model, dimension = values.get("embedding.model"), values.get("embedding.dimension")
    known = KNOWN_DIMENSIONS.get(model) if model is not None else None
    if known is not None and dimension is not None and dimension != known:
        errors.append(
            line(
                BY_KEY["embedding.dimension"],
                f"must be {known} for {model}",
                origins["embedding.dimension"],
            )
        )
    return errors


def _url_problem(spec: KeySpec, url: str) -> str | None:
    """The embedding URL rule (``storage.url`` and ``database.url`` have their own grammar)."""
    schemes = " or ".join(f"{scheme}://" for scheme in spec.schemes)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a malformed port
    except ValueError:
        return f"must be a {schemes} URL"
    if parts.scheme not in spec.schemes:
        return f"must be a {schemes} URL"
    if parts.scheme in ("http", "https"):
        if not parts.hostname:
            return "must name a host"
        # The embedding client parses with httpx: a URL it cannot take is refused here, not
        # when the worker starts.
        import httpx

        try:
            httpx.URL(url)
        except httpx.InvalidURL:
            return f"must be a {schemes} URL"
    return None
