"""How values are written: durations and sizes, the text every string value must be, and how a
value is shown back in a message.

:func:`parse_duration` and :func:`parse_size` are public for other inputs (CLI options, bench);
the loader uses the same parsers, raising :class:`Invalid` whose text is the rule, and adds the
key, the value and its source. :func:`text_problem` is the rule for any text from outside
(settings, command-line arguments, query lines).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Final

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
        return read_duration(text)
    except Invalid as exc:
        raise ValueError(f"{exc}, got {show(text)}") from None


def parse_size(text: str | int) -> int:
    """Bytes in ``text``: ``"50MB"`` (powers of 1000), ``"512KiB"`` (powers of 1024) or a number.

    Raises ValueError for negative, fractional-byte or malformed values.
    """
    try:
        return read_size(text)
    except Invalid as exc:
        raise ValueError(f"{exc}, got {show(text)}") from None


def text_problem(text: str) -> str | None:
    """The rule ``text`` breaks as text to store or send, or None.

    Bytes that are not UTF-8 (in argv, the environment or a file name) reach Python as lone
    surrogates, which no UTF-8 encoder, HTTP body or PostgreSQL ``text`` takes; PostgreSQL text
    cannot hold a NUL character either.
    """
    if "\x00" in text:
        return "must not contain a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "must be UTF-8 text"
    return None


class Invalid(Exception):
    """A single value breaks a rule; the message is the rule, without the value."""


def read_duration(raw: object) -> float:
    """Seconds in a TOML value or string; :class:`Invalid` if it is not a duration."""
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        if not math.isfinite(raw) or raw < 0:
            raise Invalid("must be a non-negative number of seconds")
        return float(raw)
    match = _DURATION.fullmatch(raw.strip()) if isinstance(raw, str) else None
    if match is None:
        raise Invalid("must be a duration such as 500ms, 30s, 5m or 1h")
    number, unit = match.groups()
    return float(Decimal(number) * _DURATION_UNITS[unit])


def read_size(raw: object) -> int:
    """Bytes in a TOML value or string; :class:`Invalid` if it is not a size."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw < 0:
            raise Invalid("must be a non-negative number of bytes")
        return raw
    match = _SIZE.fullmatch(raw.strip()) if isinstance(raw, str) else None
    if match is None:
        raise Invalid("must be a size such as 50MB, 512KiB or 1048576 (bytes)")
    number, unit = match.groups()
    size = Decimal(number) * _SIZE_UNITS[(unit or "b").lower()]
    if size != size.to_integral_value():
        raise Invalid("must be a whole number of bytes")
    return int(size)


def show(raw: object) -> str:
    """A value as a person wrote it: bare when unambiguous, quoted otherwise."""
    if isinstance(raw, bool):
        return "true" if raw else "false"
    if isinstance(raw, int | float):
        return format_number(raw)
    if isinstance(raw, str):
        return raw if re.fullmatch(r"[\w.:/@?=&%+*~<>-]+", raw) else repr(raw)
    if isinstance(raw, Path):
        return show(str(raw))
    if isinstance(raw, dict):
        return "a table"
    if isinstance(raw, list):
        return "an array"
    return f"a {type(raw).__name__}"


def format_number(value: float) -> str:
    """``5`` for ``5.0``, else the number as Python writes it."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
