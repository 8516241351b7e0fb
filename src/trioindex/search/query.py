"""A query text before it is ranked: cleaned, normalised and bounded, or refused with a reason.

:func:`prepare_query` refuses a query that is not text to store or send (a NUL, a lone
surrogate: :func:`trioindex.config.units.text_problem`, the rule for all outside text), gives
the others the form documents are stored in (:func:`trioindex.pipeline.formats.text.normalise`:
NFC, so "café" or "서울은" typed decomposed matches the stored words), turns the other control
characters into spaces, and refuses a query longer than :data:`MAX_QUERY_CHARS`.
:func:`check_terms` refuses a text query with more than :data:`MAX_QUERY_TERMS` search terms.

A refused query is a :class:`QueryRefused`: :meth:`trioindex.Index.search` raises it,
``search_many`` returns it in that query's place while the other queries get their hits, and
``search --queries`` prints it as that line's ``error`` object. Its message names the rule and
the figures, never the query text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import psycopg

from trioindex.config.units import text_problem
from trioindex.errors import StepFailure, TrioindexError

#: The longest query, in characters after normalisation (about 600 English words).
MAX_QUERY_CHARS = 4096
#: The most search terms a text (or hybrid) query may have: its English stems (stop words
#: dropped) and its Hangul words, each counted once.
MAX_QUERY_TERMS = 64

#: The ``code`` of a query refused for its text (too long, too many terms, a line that is not a
#: query); a query whose vector cannot be used carries the embedder's failure type instead.
QUERY_INVALID = "QUERY_INVALID"

# C0 and C1 control characters but tab and newline (NUL is refused, CR is normalise()'s).
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# SQLSTATE classes that mean "this input", not "this connection": data exception (22),
# program limit exceeded (54: a query too big or too deep for the server), and a syntax error.
_INPUT_SQLSTATES = ("22", "54", "42601")


class QueryRefused(TrioindexError):
    """One query that cannot be answered, and why (``code``, ``message``)."""

    def __init__(self, message: str, code: str = QUERY_INVALID) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def as_json(self) -> dict[str, Any]:
        """The ``error`` object of a ``search --queries`` line."""
        return {"code": self.code, "message": self.message}

    @classmethod
    def for_vector(cls, failure: StepFailure) -> QueryRefused:
        """The embedder's answer for this query was refused (a zero vector, a 413/422, ...)."""
        return cls(
            f"this query's vector cannot be ranked: {failure.message}", failure.failure_type.value
        )

    @classmethod
    def for_database(cls, exc: psycopg.Error) -> QueryRefused | None:
        """The query's own SQL failed on its input (not on the connection); else None."""
        state = exc.sqlstate
        if state is None and not isinstance(exc, psycopg.DataError):
            return None  # a client-side failure of the connection, not of this input
        if state is not None and not state.startswith(_INPUT_SQLSTATES):
            return None
        return cls(
            f"the database refused this query ({type(exc).__name__}, SQLSTATE {state or 'none'})"
        )


def prepare_query(text: str) -> str:
    """``text`` normalised as documents are, control characters as spaces; refused (raises
    :class:`QueryRefused`) when it holds a NUL or a lone surrogate, or when it is longer than
    :data:`MAX_QUERY_CHARS`. Idempotent."""
    # imported here: the document pipeline's module brings charset detection, which a command
    # that does not search need not load
    from trioindex.pipeline.formats.text import normalise

    problem = text_problem(text)
    if problem is not None:
        raise QueryRefused(f"the query {problem}")
    prepared = _CONTROLS.sub(" ", normalise(text))
    if len(prepared) > MAX_QUERY_CHARS:
        raise QueryRefused(
            f"the query is {len(prepared):,} characters long; the limit is {MAX_QUERY_CHARS:,}"
        )
    return prepared


def filter_text(value: str, name: str) -> str:
    """A filter value (a key prefix, a content type) as given, or :class:`QueryRefused` when it
    is not text (:func:`~trioindex.config.units.text_problem`)."""
    problem = text_problem(value)
    if problem is not None:
        raise QueryRefused(f"{name} {problem}")
    return value


def check_terms(terms: Sequence[str]) -> Sequence[str]:
    """``terms`` (a text query's ``tsquery`` operands), or :class:`QueryRefused` when there are
    more than :data:`MAX_QUERY_TERMS`."""
    if len(terms) > MAX_QUERY_TERMS:
        raise QueryRefused(
            f"the query has {len(terms):,} search terms; the limit is {MAX_QUERY_TERMS}"
        )
    return terms
