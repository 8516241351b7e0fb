"""Query preparation and refusal, strict JSON output, tsquery bounds, and how the command line
names a database error: without a database (what runs one is in test_query_batch.py)."""

from __future__ import annotations

import json
import re
import unicodedata

import psycopg
import pytest
import typer

from trioindex.cli import friendly
from trioindex.errors import ProviderRejectedInput, ResultInvalid
from trioindex.pipeline.formats.text import normalise
from trioindex.search import (
    MAX_QUERY_CHARS,
    MAX_QUERY_TERMS,
    QUERY_INVALID,
    QueryRefused,
    check_terms,
    hangul_terms,
    json_text,
    prepare_query,
)
from trioindex.search.query import filter_text


def test_a_query_is_normalised_as_documents_are() -> None:
    for text in ("café", "서울은", "\ufeffa\r\nb\rc"):
        decomposed = unicodedata.normalize("NFD", text)
        assert prepare_query(decomposed) == normalise(decomposed) == normalise(text)
    decomposed = unicodedata.normalize("NFD", "서울은")
    assert hangul_terms(decomposed) == []  # jamo are not syllables
    assert prepare_query(decomposed) == "서울은"
    assert hangul_terms(prepare_query(decomposed)) == ["('서울은':* | '서울':*)"]


def test_control_characters_become_spaces_and_what_is_not_text_is_refused() -> None:
    controls = "".join(
        chr(c)
        for c in [*range(0x01, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F, *range(0x80, 0xA0)]
    )
    assert prepare_query(f"lease{controls}renewal") == "lease" + " " * len(controls) + "renewal"
    assert prepare_query("lease\ttask\nqueue\r\n") == "lease\ttask\nqueue\n"
    text = prepare_query("caf\u0065\u0301 \x01\x9f ")
    assert prepare_query(text) == text
    for bad, rule in (
        ("lea\x00se", "the query must not contain a NUL character"),
        ("\ud800lease", "the query must be UTF-8 text"),
        ("lease \udcff", "the query must be UTF-8 text"),  # a byte that was not UTF-8
    ):
        with pytest.raises(QueryRefused) as refused:
            prepare_query(bad)
        assert (refused.value.code, refused.value.message) == (QUERY_INVALID, rule)


def test_the_length_limit_counts_the_normalised_text() -> None:
    assert len(prepare_query("x" * MAX_QUERY_CHARS)) == MAX_QUERY_CHARS
    # 4,096 composed syllables typed as 12,288 jamo still fit
    assert (
        prepare_query(unicodedata.normalize("NFD", "한" * MAX_QUERY_CHARS))
        == "한" * MAX_QUERY_CHARS
    )
    with pytest.raises(QueryRefused) as refused:
        prepare_query("secret " * 1000)
    assert refused.value.code == QUERY_INVALID
    assert refused.value.message == "the query is 7,000 characters long; the limit is 4,096"
    assert "secret" not in str(refused.value)


def test_the_terms_limit() -> None:
    terms = [f"'t{i}'" for i in range(MAX_QUERY_TERMS)]
    assert check_terms(terms) == terms
    with pytest.raises(QueryRefused, match=f"65 search terms; the limit is {MAX_QUERY_TERMS}$"):
        check_terms([*terms, "'one-more'"])


def test_a_filter_value_that_no_key_can_hold_is_refused() -> None:
    assert filter_text("papers/é", "key_prefix") == "papers/é"
    with pytest.raises(QueryRefused, match="key_prefix must not contain a NUL"):
        filter_text("pa\x00pers/", "key_prefix")
    with pytest.raises(QueryRefused, match="content_types must be UTF-8 text"):
        filter_text("text/\udc80", "content_types")


def test_refusals_name_their_cause() -> None:
    vector = QueryRefused.for_vector(
        ResultInvalid("embedding vector 0 has a zero or near-zero norm")
    )
    assert vector.as_json() == {
        "code": "EMBEDDING_RESULT_INVALID",
        "message": "this query's vector cannot be ranked: embedding vector 0 has a zero or near-zero norm",
    }
    assert (
        QueryRefused.for_vector(ProviderRejectedInput("HTTP 413")).code
        == "EMBEDDING_RESULT_INVALID"
    )
    # the query's own SQL failed on its input: this query is refused, the others go on
    for exc in (
        psycopg.errors.StatementTooComplex("stack depth limit exceeded"),
        psycopg.errors.ProgramLimitExceeded("value is too big in tsquery"),
        psycopg.errors.SyntaxError("syntax error in tsquery"),
        psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes"),
    ):
        refused = QueryRefused.for_database(exc)
        assert refused is not None and refused.code == QUERY_INVALID, exc
        assert "tsquery" not in refused.message and "NUL" not in refused.message
    # the connection went away: not this query's fault
    for lost in (
        psycopg.OperationalError("server closed the connection unexpectedly"),
        psycopg.errors.AdminShutdown("terminating connection"),
        psycopg.errors.UndefinedTable("relation does not exist"),
    ):
        assert QueryRefused.for_database(lost) is None, lost


def _explained(exc: BaseException, capsys: pytest.CaptureFixture[str]) -> list[str]:
    @friendly
    def command() -> None:
        raise exc

    with pytest.raises(typer.Exit) as exit_info:
        command()
    assert exit_info.value.exit_code == 1
    return capsys.readouterr().err.strip().splitlines()


def test_an_input_error_is_never_called_a_lost_connection(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _explained(psycopg.errors.StatementTooComplex("stack depth limit exceeded"), capsys) == [
        "trioindex: database error StatementTooComplex (SQLSTATE 54001)"
    ]
    assert _explained(psycopg.errors.ProgramLimitExceeded("too big"), capsys) == [
        "trioindex: database error ProgramLimitExceeded (SQLSTATE 54000)"
    ]
    assert _explained(psycopg.DataError("cannot contain NUL"), capsys) == [
        "trioindex: database error DataError (SQLSTATE ?)"
    ]
    # what is a lost connection still says so
    assert _explained(psycopg.errors.AdminShutdown("terminating connection"), capsys) == [
        "trioindex: lost the database connection (AdminShutdown, SQLSTATE 57P01); re-run"
    ]
    assert _explained(psycopg.errors.ConnectionFailure("gone"), capsys) == [
        "trioindex: lost the database connection (ConnectionFailure, SQLSTATE 08006); re-run"
    ]
    # two tasks meeting the same failure are one line, not an exception group's traceback
    group = ExceptionGroup(
        "two", [psycopg.OperationalError("closed"), psycopg.OperationalError("closed")]
    )
    assert _explained(group, capsys) == ["trioindex: lost the database connection (closed); re-run"]


def test_json_text_is_strict_and_encodes_to_utf8() -> None:
    value = {"id": "\udc80", "text": "서울 café", "pair": "\ud83d\ude00"}
    text = json_text(value)
    text.encode("utf-8")  # would raise on a lone surrogate
    assert json.loads(text) == {"id": "\udc80", "text": "서울 café", "pair": "😀"}
    assert "서울 café" in text  # not escaped
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError, match="JSON compliant"):
            json_text({"score": bad})


def test_tsquery_text_stays_within_what_postgresql_takes() -> None:
    # a Hangul word longer than PostgreSQL's longest word matches nothing: left out
    assert hangul_terms("나" * 682) == ["'" + "나" * 682 + "':*"]
    assert hangul_terms("나" * 683) == []


def test_the_readme_states_the_limits_the_code_enforces() -> None:
    from pathlib import Path

    from trioindex.embedding.vectors import MIN_NORM

    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("**What a query may be.**") :]
    rows = [line for line in section.splitlines()[:12] if line.startswith("| ")]
    assert f"| {MAX_QUERY_CHARS:,} characters | `{QUERY_INVALID}` |" in rows[2]
    assert f"| {MAX_QUERY_TERMS} | `{QUERY_INVALID}` |" in rows[3]
    for pattern, text in (
        (r"a norm of at least (\S+) ", rows[4]),
        (r"a vector of norm below (\S+) ", readme),
    ):
        found = re.search(pattern, text)
        assert found and float(found.group(1)) == MIN_NORM, pattern
