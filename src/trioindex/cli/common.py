"""What every ``trioindex`` command shares: the Typer application, settings and logging set-up,
the error translation (:func:`friendly`), and small runners.

Errors meant for people (bad configuration, a database that is down, an unknown job, a model
mismatch) print one line and exit non-zero; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, ParamSpec, TypeVar

import psycopg
import trio
import typer

from trioindex import admin
from trioindex.config import Settings, load_settings
from trioindex.errors import ConfigError, TrioindexError
from trioindex.logs import configure_logging

logger = logging.getLogger("trioindex.cli")

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Turn documents into searchable pgvector embeddings with a fleet of Trio workers.",
    # a bug's traceback must not print local variables: they hold URLs with passwords
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"trioindex {version('trioindex')}")
        raise typer.Exit()


@app.callback()
def _main(
    _version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    # Start-up stays lean: each command imports what it needs (torch, minio, the parsers, the
    # embedding clients) inside its own body, so `status`, `jobs` and `--help` answer in about
    # a second and `search` against an embedding server never loads torch.
    pass


P = ParamSpec("P")
T = TypeVar("T")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def friendly(fn: Callable[P, T]) -> Callable[P, T]:
    """Turn trioindex's own errors into one line on stderr and a non-zero exit.

    Errors raised inside Trio nurseries arrive wrapped in exception groups; a group holding one
    error is explained as that error (a database that went away while the worker registers is
    still one line, not a traceback).
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            explained = _explain(_sole_error(exc))
            if explained is None:
                raise
            code, line = explained
            typer.echo(f"trioindex: {line}", err=True)
            raise typer.Exit(code) from None

    return wrapper


def _sole_error(exc: BaseException) -> BaseException:
    """The one error inside (nested) single-member exception groups, else ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _explain(exc: BaseException) -> tuple[int, str] | None:
    """Exit code and message for an error meant for people; None for a bug."""
    from psycopg_pool import PoolTimeout

    if isinstance(exc, ConfigError):
        return 2, f"configuration error: {exc}"
    if isinstance(exc, TrioindexError | FileNotFoundError):
        return 1, str(exc)
    if isinstance(exc, psycopg.OperationalError | PoolTimeout):
        # the server went away mid-command (restart, failover, network); every command is
        # safe to re-run: ingest skips what it already enqueued. A client-side failure's first
        # line names host and port, never the password; a server-sent one (it has a SQLSTATE)
        # may quote data, so only its class is named.
        sqlstate = getattr(exc, "sqlstate", None)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        why = f"{type(exc).__name__}, SQLSTATE {sqlstate}" if sqlstate else first
        return 1, f"lost the database connection ({why}); re-run"
    if isinstance(exc, psycopg.Error):
        # the class and SQLSTATE only: a server message may quote the data it refused
        return 1, f"database error {type(exc).__name__} (SQLSTATE {exc.sqlstate or '?'})"
    return None


def command_settings(json_logs: bool = False, quiet: bool = False) -> Settings:
    settings = load_settings()
    configure_logging(
        "json" if json_logs else settings.log_format,
        logging.WARNING if quiet else logging.INFO,
    )
    return settings


def run(fn: Callable[[], Awaitable[T]]) -> T:
    return trio.run(fn)


def print_json(value: object) -> None:
    typer.echo(json.dumps(admin.as_json(value), ensure_ascii=False, indent=2))


def database_call(settings: Settings, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    from trioindex.db.pool import open_database
    from trioindex.services import resolve_database_url

    async def go() -> T:
        url = await resolve_database_url(settings)
        async with open_database(url, pool_size=1) as db:
            return await db.run(fn, *args, **kwargs)

    return run(go)
