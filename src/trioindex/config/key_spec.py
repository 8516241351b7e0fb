"""What a configuration key is: :class:`KeySpec` (its name, environment variable, default, kind,
rule and meaning), the :class:`Kind` that says how its text is parsed, a numeric
:class:`Bound` and the error it gives, a :class:`Derived` default, and :func:`env_name`, the
environment variable every key is also read from. The keys themselves are in
:mod:`trioindex.config.keys`."""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from typing import Final

import attrs

from trioindex.config.units import format_number

ENV_PREFIX: Final = "TRIOINDEX_"


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
