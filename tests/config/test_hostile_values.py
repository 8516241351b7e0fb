"""Configuration values from outside that the rest of the program could not carry.

``database.url`` in libpq's ``key=value`` form is accepted as psycopg accepts it, and a database
URL of either form that is refused is never echoed with its password. Text that is not UTF-8 (a
TOML file, bytes in an environment variable), a NUL character, an API key no HTTP header can
hold and a model name longer than the database takes are each one line naming the key.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trioindex.config import load_settings
from trioindex.db.pool import with_dbname
from trioindex.errors import ConfigError

PASSWORD = "XyZ-s3cret"


def load_error(tmp_path: Path, env: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings(environ=env, cwd=tmp_path)
    return str(info.value)


# --- database.url in both of libpq's forms ----------------------------------------------------


@pytest.mark.parametrize(
    "conninfo",
    [
        f"host=db user=ti password={PASSWORD}",
        f"host=db port=5433 dbname=ti user=ti password='{PASSWORD} with spaces' sslmode=prefer",
        "host=/run/postgresql,db2 port=5432,5433 dbname=ti",
        "postgresql://ti@h1:5432,h2:5433/ti",
    ],
)
def test_a_key_value_connection_string_is_a_database_url(tmp_path: Path, conninfo: str) -> None:
    from_env = load_settings(environ={"TRIOINDEX_DATABASE_URL": conninfo}, cwd=tmp_path)
    assert from_env.database.url == conninfo
    # a JSON string is a TOML basic string
    (tmp_path / "trioindex.toml").write_text(f"[database]\nurl = {json.dumps(conninfo)}\n")
    assert load_settings(environ={}, cwd=tmp_path).database.url == conninfo


@pytest.mark.parametrize(
    ("conninfo", "problem", "shown"),
    [
        (
            f"host=db user=ti password='{PASSWORD}",
            "(unterminated quoted string in connection info string)",
            "got <hidden>",
        ),
        (f"host=db password={PASSWORD} stray", "(a syntax error)", "got <hidden>"),
        (f"host=db passwrd={PASSWORD}", "(invalid connection option)", "got <hidden>"),
        (
            f"host=db port=five password={PASSWORD}",
            "(the port must be a number)",
            "got 'password=*** host=db port=five'",
        ),
        (
            f"postgresql://h/db password={PASSWORD}",
            "(unexpected spaces found in)",
            "got 'postgresql://h/db password=***'",
        ),
        (
            f"postgresql://u:{PASSWORD}@h:five/db",
            "(the port must be a number)",
            "got postgresql://u:***@h:five/db",
        ),
        (f"mysql://u:{PASSWORD}@h/db", "connection string, got", "got mysql://u:***@h/db"),
    ],
)
def test_a_refused_database_url_never_shows_its_password(
    tmp_path: Path, conninfo: str, problem: str, shown: str
) -> None:
    message = load_error(tmp_path, {"TRIOINDEX_DATABASE_URL": conninfo})
    assert message.startswith(
        "database.url: must be a postgresql:// URL or a key=value connection string"
    )
    assert problem in message and shown in message
    assert PASSWORD not in message and "\n" not in message


def test_with_dbname_replaces_a_dbname_given_in_the_query() -> None:
    url = with_dbname(f"postgresql://u:{PASSWORD}@h/a?dbname=a&sslmode=disable", "b")
    assert url == f"postgresql://u:{PASSWORD}@h/b?sslmode=disable"


# --- text that cannot travel -----------------------------------------------------------------


def test_a_toml_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "trioindex.toml"
    path.write_bytes(b'[embedding]\nmodel = "m"\napi-key = "s\xffcret"\n')
    message = load_error(tmp_path, {})
    assert message == f"{path}: not UTF-8 text (line 3); TOML files must be UTF-8"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"TRIOINDEX_EMBEDDING_MODEL": "bge\udcff"},
            "embedding.model: must be UTF-8 text, got 'bge\\udcff' (from TRIOINDEX_EMBEDDING_MODEL)",
        ),
        (
            {"TRIOINDEX_EMBEDDING_API_KEY": "s\udcffcret"},
            "embedding.api-key: must be UTF-8 text, got <hidden> (from TRIOINDEX_EMBEDDING_API_KEY)",
        ),
        (
            {"TRIOINDEX_EMBEDDING_API_KEY": "clé-secrète"},
            "embedding.api-key: must be printable ASCII (it is sent in an HTTP header),"
            " got <hidden> (from TRIOINDEX_EMBEDDING_API_KEY)",
        ),
        (
            {"TRIOINDEX_EMBEDDING_API_KEY": "sk\tsecret"},
            "embedding.api-key: must be printable ASCII (it is sent in an HTTP header),"
            " got <hidden> (from TRIOINDEX_EMBEDDING_API_KEY)",
        ),
        (
            {
                "TRIOINDEX_EMBEDDING_URL": "http://h:1",
                "TRIOINDEX_EMBEDDING_MODEL": "m" * 201,
                "TRIOINDEX_EMBEDDING_DIMENSION": "8",
            },
            "embedding.model: must be at most 200 characters, got "
            + "m" * 201
            + " (from TRIOINDEX_EMBEDDING_MODEL)",
        ),
    ],
    ids=["model not utf-8", "key not utf-8", "key not ascii", "key control", "model too long"],
)
def test_text_no_header_or_column_can_hold_is_one_line(
    tmp_path: Path, env: dict[str, str], expected: str
) -> None:
    assert load_error(tmp_path, env) == expected


def test_a_nul_character_in_the_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "trioindex.toml").write_text('[embedding]\nmodel = "a\\u0000b"\ndimension = 8\n')
    message = load_error(tmp_path, {})
    assert message.startswith("embedding.model: must not contain a NUL character, got ")
