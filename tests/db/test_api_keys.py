"""API keys (db/api_keys.py) on a real PostgreSQL: only a hash is stored, a token checks by its
own row, a revocation refuses the token from its commit on, and hostile tokens are refused
without a query error."""

from __future__ import annotations

import hashlib

import psycopg
import pytest

from tests import helpers
from trioindex.db.api_keys import (
    REVOKED_CHANNEL,
    KeyRefused,
    Role,
    check_token,
    create_key,
    list_keys,
    revoke_key,
)
from trioindex.db.pool import Database
from trioindex.errors import NotFound, TrioindexError


def test_a_created_key_stores_only_the_hash_of_its_token(db: Database) -> None:
    with db.connection() as conn:
        key, token = create_key(conn, "search-page", Role.READ)
        row = conn.execute("SELECT * FROM api_keys").fetchone()
        assert row is not None
        assert row["key_hash"] == hashlib.sha256(token.encode()).hexdigest()
        assert token not in str(row) and token.split("_")[2] not in str(row)
        assert check_token(conn, token) == key
        assert key.role is Role.READ and key.revoked_at is None


def test_a_revoked_key_is_refused_at_once_and_keeps_its_name(db: Database) -> None:
    with db.connection() as conn:
        _, token = create_key(conn, "uploader", Role.WRITE)
        revoked = revoke_key(conn, "uploader")
        assert revoked.revoked_at is not None
        with pytest.raises(KeyRefused, match="revoked"):
            check_token(conn, token)
        assert revoke_key(conn, "uploader").revoked_at == revoked.revoked_at
        with pytest.raises(TrioindexError, match="exists"):
            create_key(conn, "uploader", Role.READ)
        with pytest.raises(NotFound):
            revoke_key(conn, "nobody")
        assert [k.name for k in list_keys(conn)] == ["uploader"]


@pytest.mark.parametrize(
    "token",
    [
        "",
        "Bearer x",
        "ti_" + "0" * 32 + "_" + "A" * 43,  # well formed, names no key
        "ti_zz" + "0" * 30 + "_" + "A" * 43,
        "ti_" + "0" * 32 + "_" + "A" * 42 + "\x00",
        "ti_" + "0" * 32 + "_" + "é" * 43,
        "x" * 100_000,
    ],
)
def test_hostile_tokens_are_refused(db: Database, token: str) -> None:
    with db.connection() as conn:
        create_key(conn, "k", Role.ADMIN)
        with pytest.raises(KeyRefused):
            check_token(conn, token)


def test_a_token_with_another_keys_id_is_refused(db: Database) -> None:
    with db.connection() as conn:
        first, first_token = create_key(conn, "a", Role.ADMIN)
        _, second_token = create_key(conn, "b", Role.READ)
        forged = f"ti_{first.id.hex}_{second_token.split('_', 2)[2]}"
        with pytest.raises(KeyRefused, match="unknown"):
            check_token(conn, forged)
        assert check_token(conn, first_token).name == "a"


def test_roles_are_ordered() -> None:
    assert Role.ADMIN.allows(Role.WRITE) and Role.WRITE.allows(Role.READ)
    assert not Role.READ.allows(Role.WRITE) and not Role.WRITE.allows(Role.ADMIN)


def test_key_names_are_bounded(db: Database) -> None:
    with db.connection() as conn:
        helpers.model(conn)
        for name in ("", "n" * 101):
            with pytest.raises(TrioindexError, match="1 to 100"):
                create_key(conn, name, Role.READ)


def test_a_revocation_is_announced_with_its_commit_only(db: Database, database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(f"LISTEN {REVOKED_CHANNEL}")
        with db.connection() as conn:
            kept, _ = create_key(conn, "kept", Role.READ)
            gone, _ = create_key(conn, "gone", Role.READ)
            with pytest.raises(RuntimeError), conn.transaction():
                revoke_key(conn, "kept")
                raise RuntimeError("rolled back")
            revoke_key(conn, "gone")
        heard = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
        assert heard == [str(gone.id)]
        assert list(listener.notifies(timeout=0.2)) == []  # the rolled-back one said nothing
        assert str(kept.id) not in heard
