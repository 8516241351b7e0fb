"""What every ``trioindex`` command shares: the Typer application, settings and logging set-up,
argument checks, the error translation (:func:`friendly`), and small runners.

Errors meant for people (bad configuration, a database that is down, an unknown job, a model
mismatch) print one line and exit non-zero; anything else is a bug and keeps its traceback. A
bad argument is one line too, ``trioindex: Invalid value for '--priority': ...``, exit code 2,
before the command does anything: text arguments must be UTF-8 (:func:`text_problem`), and the
options typed here (:func:`priority_option`, :data:`ModelName`) carry the database's bounds.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Final, ParamSpec, TypeVar

import typer
from typer.core import TyperGroup

from trioindex.config import Settings, ensure_home, load_settings
from trioindex.config.home import CREATED_HOME
from trioindex.config.settings import MODEL_NAME_MAX
from trioindex.config.units import text_problem
from trioindex.errors import ConfigError, TrioindexError
from trioindex.logs import configure_logging, flush_logs
from trioindex.values import as_json

if TYPE_CHECKING:  # psycopg loads libpq: imported only by the commands that use it
    import psycopg

logger = logging.getLogger("trioindex.cli")


def _click() -> Any:
    """The click Typer runs on: its own copy (``typer._click``) from 0.28 on, click before."""
    try:
        return importlib.import_module("typer._click")
    except ImportError:  # pragma: no cover -- the lock file pins typer 0.28
        return importlib.import_module("click")


_CLICK: Final = _click()
_get_current_context = importlib.import_module(_CLICK.__name__ + ".globals").get_current_context


class OneLineUsageErrors(TyperGroup):
    """The application's command group: a usage error (an unknown option, a value outside its
    range, a missing argument) is one line on stderr naming the argument, exit code 2, instead
    of the usage text and a framed panel."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        run_main = functools.partial(
            super().main, args, prog_name, complete_var, windows_expand_args=windows_expand_args
        )
        if not standalone_mode:
            return run_main(standalone_mode=False, **extra)
        try:
            code = run_main(standalone_mode=False, **extra)
        except _CLICK.exceptions.ClickException as exc:
            # the help asked for by giving no arguments has been printed already
            if type(exc).__name__ != "NoArgsIsHelpError":
                typer.echo(usage_line(exc), err=True)
            sys.exit(exc.exit_code)
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        with closed_pipe_is_the_end():  # the help, printed while the arguments are parsed
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:
        with closed_pipe_is_the_end():
            return super().invoke(ctx)


@contextlib.contextmanager
def closed_pipe_is_the_end() -> Iterator[None]:
    """A reader that went away (``trioindex status | head -1``) ends the command quietly with
    exit code 0: a closed pipe is not an error."""
    try:
        yield
    except BaseException as exc:
        if not _closed_pipe(exc):
            raise
        # later writes (the interpreter's final flush included) go nowhere
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        raise typer.Exit(0) from None


def _closed_pipe(exc: BaseException) -> bool:
    """A BrokenPipeError, alone or as every member of (nested) exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_closed_pipe(e) for e in exc.exceptions)
    return isinstance(exc, BrokenPipeError)


def usage_line(exc: Any) -> str:
    """``trioindex: Invalid value for '--top-k': ... (try 'trioindex search -h')``."""
    message = "; ".join(part.strip() for part in exc.format_message().splitlines() if part.strip())
    ctx = getattr(exc, "ctx", None)
    hint = f" (try '{ctx.command_path} -h')" if ctx is not None else ""
    return f"trioindex: {message}{hint}"


app = typer.Typer(
    cls=OneLineUsageErrors,
    no_args_is_help=True,
    add_completion=False,
    help="Turn documents into searchable pgvector embeddings with a fleet of Trio workers.",
    # a bug's traceback must not print local variables: they hold URLs with passwords
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    # plain help: rich would load its Markdown stack (0.15 s of CPU) for every `--help`
    rich_markup_mode=None,
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
    # Start-up stays lean: each command imports what it needs (psycopg, Trio, torch, minio, the
    # parsers, the embedding clients) inside its own body, so `--help` and `--version` load
    # none of them, and `search` against an embedding server or with a worker's model borrowed
    # (trioindex.embedding.warm) never loads torch.
    pass


P = ParamSpec("P")
T = TypeVar("T")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]

#: A job's priority is a PostgreSQL ``integer`` (embedding_jobs.priority).
PRIORITY_MIN: Final = -(2**31)
PRIORITY_MAX: Final = 2**31 - 1


def priority_option(help: str) -> Any:
    """A ``--priority`` option, refused at parse time outside the column's range."""
    return typer.Option(min=PRIORITY_MIN, max=PRIORITY_MAX, help=help)


def _model_name(name: str) -> str:
    if not 1 <= len(name) <= MODEL_NAME_MAX:
        raise typer.BadParameter(f"a model name is 1 to {MODEL_NAME_MAX} characters")
    return name


#: A model NAME argument, as long as embedding_models.name allows.
ModelName = Annotated[str, typer.Argument(callback=_model_name, help="The model's name.")]


def refuse_bad_text(arguments: dict[str, Any]) -> None:
    """Refuse a text argument that :func:`text_problem` refuses, naming it (a usage error).

    Bytes in argv that are not UTF-8 arrive as lone surrogates: no database query, HTTP request
    or printed line can carry them. Paths are left alone: a file name may be any bytes, and
    ``ingest`` reports such files one by one.
    """
    for name, value in arguments.items():
        for item in value if isinstance(value, list | tuple) else [value]:
            problem = text_problem(item) if isinstance(item, str) else None
            if problem is not None:
                ctx = _get_current_context(silent=True)
                params = ctx.command.params if ctx is not None else []
                param = next((p for p in params if p.name == name), None)
                raise typer.BadParameter(problem, ctx=ctx, param=param)


def friendly(fn: Callable[P, T]) -> Callable[P, T]:
    """Refuse undecodable text arguments (:func:`refuse_bad_text`), then turn trioindex's own
    errors into one line on stderr and a non-zero exit.

    Errors raised inside Trio nurseries arrive wrapped in exception groups; a group holding
    errors of one type is explained as its first (a database that went away while the worker
    registers, or under several search tasks at once, is still one line, not a traceback).
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        refuse_bad_text(kwargs)
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            flush_logs()  # the lines logged before the error come before its line or traceback
            explained = _explain(_sole_error(exc))
            if explained is None:
                raise
            code, line = explained
            typer.echo(f"trioindex: {line}", err=True)
            raise typer.Exit(code) from None

    return wrapper


def _sole_error(exc: BaseException) -> BaseException:
    """The one error inside (nested) exception groups whose members are all of one type (the
    same failure met by several tasks), else ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup) and len({type(e) for e in exc.exceptions}) == 1:
        exc = exc.exceptions[0]
    return exc


# SQLSTATEs of a connection that went away: connection exceptions (08), and the server shutting
# down, not accepting connections yet, or ending an idle session (57P01-57P05).
_CONNECTION_LOST = ("08", "57P0")


def _connection_lost(exc: psycopg.Error) -> bool:
    """Whether ``exc`` means the connection is gone (a client-side operational failure, or a
    server-sent one of :data:`_CONNECTION_LOST`), rather than a statement that failed on a
    connection still there (a value the server refused, a statement too complex)."""
    import psycopg

    if not isinstance(exc, psycopg.OperationalError):
        return False
    return exc.sqlstate is None or exc.sqlstate.startswith(_CONNECTION_LOST)


def _explain(exc: BaseException) -> tuple[int, str] | None:
    """Exit code and message for an error meant for people; None for a bug."""
    import psycopg
    from psycopg_pool import PoolTimeout

    if isinstance(exc, ConfigError):
        return 2, f"configuration error: {exc}"
    if isinstance(exc, TrioindexError | FileNotFoundError):
        return 1, str(exc)
    if isinstance(exc, PoolTimeout) or (isinstance(exc, psycopg.Error) and _connection_lost(exc)):
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


def command_settings(
    json_logs: bool = False,
    quiet: bool = False,
    *,
    database: bool = True,
    storage: bool = False,
    buffered_logs: bool = False,
) -> Settings:
    """The settings, with logging set up (``buffered_logs``: lines below WARNING written in
    batches, for a command logging a line per job). The home is created (and where it is said
    on stderr, one line) when the command will use it: with ``database`` for the embedded
    database, with ``storage`` for the folder store."""
    settings = load_settings()
    configure_logging(
        "json" if json_logs else settings.log_format,
        logging.WARNING if quiet else logging.INFO,
        buffered=buffered_logs,
    )
    uses_home = (database and settings.database.url is None) or (
        storage and settings.storage.url is None
    )
    if uses_home and ensure_home(settings.home):
        typer.echo(f"trioindex: {CREATED_HOME.format(home=settings.home)}", err=True)
    return settings


def run(fn: Callable[[], Awaitable[T]]) -> T:
    import trio

    return trio.run(fn)


def print_json(value: object) -> None:
    typer.echo(json.dumps(as_json(value), ensure_ascii=False, indent=2))


def database_call(settings: Settings, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    from trioindex.db.pool import open_database
    from trioindex.services import resolve_database_url

    async def go() -> T:
        url = await resolve_database_url(settings)
        async with open_database(url, pool_size=1) as db:
            return await db.run(fn, *args, **kwargs)

    return run(go)
