"""The claim-token trap: a trigger recording every claim token the database hands out, so that
a scan of the logs can prove none of them was printed (tests/worker/test_process.py, the chaos run)."""

from __future__ import annotations

from testkit.processes import query

_TRAP = """
CREATE TABLE testkit_seen_tokens (token uuid NOT NULL);
CREATE FUNCTION testkit_trap_token() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.claim_token IS NOT NULL THEN
        INSERT INTO testkit_seen_tokens VALUES (NEW.claim_token);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER testkit_trap AFTER UPDATE OF claim_token ON embedding_jobs
    FOR EACH ROW EXECUTE FUNCTION testkit_trap_token();
"""


def install_token_trap(url: str) -> None:
    """Add the trap to the (migrated) database at ``url``."""
    query(url, _TRAP)


def seen_tokens(url: str) -> set[str]:
    """Every claim token handed out since :func:`install_token_trap`."""
    return {str(r["token"]) for r in query(url, "SELECT DISTINCT token FROM testkit_seen_tokens")}
