"""The ``trioindex`` command line: worker, migrate, ingest, search, status, jobs, healthcheck.

Every command that prints data takes ``--json``. Errors meant for people (bad configuration, a
database that is down, an unknown job, a model mismatch) print one line and exit non-zero;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import functools
import json
import logging
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TextIO, TypeVar
from uuid import UUID

import psycopg
import trio
import typer

from trioindex import admin
from trioindex.config import Settings, load_settings
from trioindex.db.pool import migrate_or_explain
from trioindex.errors import ConfigError, TrioindexError
from trioindex.logs import configure_logging
from trioindex.values import JobStatus

logger = logging.getLogger("trioindex.cli")

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Turn documents into searchable pgvector embeddings with a fleet of Trio workers.",
    # a bug's traceback must not print local variables: they hold URLs with passwords
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
jobs_app = typer.Typer(no_args_is_help=True, help="List, inspect and retry indexing jobs.")
app.add_typer(jobs_app, name="jobs")


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


def _hide_flag_types() -> None:
    """Help lists no value type for a flag: typer 0.29 prints ``<bool>`` for options that take
    no value (``--json``, ``--help``), which reads as if they wanted one."""
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_hide_flag_types()

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


def _settings(json_logs: bool = False, quiet: bool = False) -> Settings:
    settings = load_settings()
    configure_logging(
        "json" if json_logs else settings.log_format,
        logging.WARNING if quiet else logging.INFO,
    )
    return settings


def _run(fn: Callable[[], Awaitable[T]]) -> T:
    return trio.run(fn)


def _print_json(value: object) -> None:
    typer.echo(json.dumps(admin.as_json(value), ensure_ascii=False, indent=2))


# --- worker / migrate ----------------------------------------------------------------------------


@app.command()
@friendly
def worker(
    drain: Annotated[
        bool, typer.Option(help="Exit 0 once nothing is claimable and nothing is running.")
    ] = False,
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve Prometheus metrics on this port.")
    ] = None,
    json_logs: Annotated[bool, typer.Option(help="Log one JSON object per line.")] = False,
) -> None:
    """Run a worker: migrate, register, then claim and index jobs until SIGTERM/SIGINT."""
    settings = _settings(json_logs)
    from trioindex.worker.wiring import run_worker

    if metrics_port is not None:
        from trioindex.worker.metrics import start_metrics_server

        start_metrics_server(metrics_port)
    done = _run(functools.partial(run_worker, settings, drain=drain))
    logger.info("worker exited: %s", done.counters.snapshot())


@app.command()
@friendly
def migrate() -> None:
    """Apply pending schema migrations (safe to run from several processes at once)."""
    settings = _settings()
    from trioindex.services import resolve_database_url

    url = _run(functools.partial(resolve_database_url, settings))
    applied = migrate_or_explain(url)
    typer.echo(f"applied migrations: {applied}" if applied else "schema is up to date")


# --- ingest --------------------------------------------------------------------------------------


@app.command()
@friendly
def ingest(
    paths: Annotated[
        list[Path], typer.Argument(metavar="PATH...", help="Files or folders (recursive).")
    ],
    *,
    wait: Annotated[bool, typer.Option(help="Wait until every job ends; show progress.")] = False,
    priority: Annotated[int, typer.Option(help="Higher runs first.")] = 0,
    follow_symlinks: Annotated[
        bool,
        typer.Option(
            "--follow-symlinks",
            help="Also follow symbolic links whose target is outside the folder.",
        ),
    ] = False,
    key_as: Annotated[
        str | None,
        typer.Option(
            "--as",
            metavar="KEY",
            help="Document key of the file, or key prefix of the folder's files"
            " (default: the path relative to the current folder).",
        ),
    ] = None,
    sync: Annotated[
        bool,
        typer.Option(
            "--sync",
            help="Also delete the documents under each folder's key prefix whose files are gone.",
        ),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Upload files and enqueue one indexing job per new or changed document.

    A document's key is its path relative to the current folder (`ingest a/` → `a/README.md`);
    a folder outside it is keyed from itself, unless --as gives the prefix. A file that cannot
    be ingested is reported and the rest go on; the exit code is 1 when any was. --sync then
    deletes the documents under each folder's key prefix (`a/`) that have no file any more.
    """
    if key_as is not None and not key_as.strip().strip("/"):
        raise typer.BadParameter("--as needs a non-empty key")
    settings = _settings(quiet=as_json)
    from trioindex.ingest import IngestEntry, IngestResult, ingest_paths
    from trioindex.services import open_services

    async def go() -> tuple[list[IngestEntry], list[dict[str, Any]]]:
        async with open_services(settings) as services:
            entries = await ingest_paths(
                paths,
                db=services.db,
                store=services.storage,
                model_id=services.model.id,
                max_attempts=settings.worker.max_attempts,
                priority=priority,
                follow_symlinks=follow_symlinks,
                key_as=key_as,
                sync=sync,
            )
            finals: list[dict[str, Any]] = []
            if wait:
                from trioindex.progress import wait_for_jobs

                queued = [
                    e.job_id
                    for e in entries
                    if isinstance(e, IngestResult)
                    and e.job_id
                    and (e.status == "created" or e.requeued)
                ]
                finals = await wait_for_jobs(
                    services.db,
                    queued,
                    show=not as_json,
                    heartbeat_timeout=settings.worker.heartbeat_timeout,
                )
            return entries, finals

    entries, finals = _run(go)
    failed = [f for f in finals if f["status"] == "FAILED"]
    for entry in entries:
        typer.echo(json.dumps(entry.as_json()) if as_json else _ingest_line(entry))
    if not as_json:
        typer.echo(_ingest_summary(entries, sync=sync))
        _outside_note(paths, key_as)
    errors = sum(1 for e in entries if e.status == "error")
    if errors:
        typer.echo(f"trioindex: {errors} file(s) could not be ingested (see above)", err=True)
    for f in failed:
        typer.echo(f"FAILED {f['external_key']}: {f['last_failure_type']}", err=True)
    if failed or errors:
        raise typer.Exit(1)


def _outside_note(paths: list[Path], key_as: str | None) -> None:
    """Say when a folder outside the current one was keyed from itself: files of the same
    names in another such folder would be new versions of these documents."""
    from trioindex.ingest.discover import keyed_by_itself

    for folder in [] if key_as is not None else keyed_by_itself(paths):
        typer.echo(
            f"note: {folder} is outside the current folder, so its keys start below it; "
            "ingest it from a folder that contains it, or give --as NAME, to keep another "
            "folder's files of the same names apart",
            err=True,
        )


def _ingest_line(entry: Any) -> str:
    """One human line per file: what happened, the key, and the version or the reason."""
    from trioindex.ingest import IngestResult

    if not isinstance(entry, IngestResult):
        return f"{entry.status:9} {entry.document_key or entry.path}  {entry.reason}"
    note = f"version {entry.version_no}"
    if entry.status == "repaired":
        note += ": stored copy restored" + (", job requeued" if entry.requeued else "")
    return f"{entry.status:9} {entry.document_key}  ({note})"


def _ingest_summary(entries: list[Any], *, sync: bool = False) -> str:
    """``2 added, 1 changed, 5 unchanged`` (+ ``deleted`` with --sync, + the rarer ones)."""
    changes = [getattr(e, "change", e.status) for e in entries]
    counts = {s: changes.count(s) for s in _INGEST_CHANGES}
    shown = ("added", "changed", "unchanged") + (("deleted",) if sync else ())
    parts = [f"{counts[s]} {s}" for s in shown]
    parts += [f"{counts[s]} {s}" for s in ("repaired", "skipped") if counts[s]]
    if counts["error"]:
        parts.append(f"{counts['error']} error" + ("s" if counts["error"] > 1 else ""))
    return ", ".join(parts)


_INGEST_CHANGES = ("added", "changed", "unchanged", "deleted", "repaired", "skipped", "error")


# --- search / status -----------------------------------------------------------------------------


@app.command()
@friendly
def search(
    text: Annotated[str | None, typer.Argument(help="What to look for.")] = None,
    *,
    top_k: Annotated[int, typer.Option("--top-k", min=1, max=1000)] = 5,
    mode: Annotated[
        str, typer.Option(help="vector, text (full-text) or hybrid (both, fused by rank).")
    ] = "hybrid",
    chunks: Annotated[
        bool, typer.Option("--chunks", help="List chunks (several may share a document).")
    ] = False,
    chunks_per_document: Annotated[
        int, typer.Option(min=1, max=100, help="Best chunks shown per document.")
    ] = 3,
    prefix: Annotated[
        str | None, typer.Option(help="Only documents whose key starts with this (a folder).")
    ] = None,
    content_type: Annotated[
        list[str] | None,
        typer.Option(help="Only documents of this type (text/markdown) or family (text); repeat."),
    ] = None,
    queries: Annotated[
        str | None,
        typer.Option(
            metavar="FILE|-",
            help='Many queries: JSON lines {"id", "text"} in, JSON lines {"id", "results"} out.',
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Search the current version of every document: documents with their best chunks."""
    from trioindex.search import SEARCH_MODES

    if (text is None) == (queries is None):
        raise typer.BadParameter("give a query TEXT or --queries FILE|- (not both)")
    if mode not in SEARCH_MODES:
        raise typer.BadParameter(f"--mode must be one of {', '.join(SEARCH_MODES)}")
    settings = _settings(quiet=True)
    from trioindex.api import Index

    options: dict[str, Any] = {
        "top_k": top_k,
        "mode": mode,  # checked against SEARCH_MODES
        "key_prefix": prefix,
        "content_types": tuple(content_type or ()),
    }

    def ranked(index: Index, texts: list[str]) -> Awaitable[list[list[Any]]]:
        if chunks:
            return index.search_chunks_many(texts, **options)
        return index.search_many(texts, chunks_per_document=chunks_per_document, **options)

    if queries is not None:
        stream = sys.stdin if queries == "-" else open(queries, encoding="utf-8")  # noqa: SIM115
        with stream:
            _run(functools.partial(_search_query_lines, settings, stream, ranked))
        return
    assert text is not None

    async def go() -> list[Any]:
        async with Index.open(settings) as index:
            (hits,) = await ranked(index, [text])
            return hits

    hits = _run(go)
    if as_json:
        _print_json([h.as_json() for h in hits])
        return
    if not hits:
        typer.echo("no results (is anything indexed yet? try `trioindex status`)")
    for hit in hits:
        if chunks:
            typer.echo(f"{hit.rank:>3}. {hit.score:.4f}  {hit.document_key} #{hit.chunk_index}")
            typer.echo(f"     {hit.snippet()}")
            continue
        typer.echo(f"{hit.rank:>3}. {hit.score:.4f}  {hit.document_key}  (v{hit.version_no})")
        for c in hit.chunks:
            typer.echo(f"       #{c.chunk_index:<4} {c.score:.4f}  {c.snippet(120)}")


#: Queries embedded and ranked together by `search --queries`.
QUERY_BATCH = 64


async def _search_query_lines(
    settings: Settings,
    stream: TextIO,
    ranked: Callable[[Any, list[str]], Awaitable[list[list[Any]]]],
) -> None:
    """`search --queries`: read JSON lines in batches, print one JSON line per query."""
    from trioindex.api import Index

    async with Index.open(settings) as index:
        line_no = 0
        while True:
            lines = await trio.to_thread.run_sync(_read_lines, stream, QUERY_BATCH)
            batch = []
            for line in lines:
                line_no += 1
                if line.strip():
                    batch.append(_query_line(line, line_no))
            if batch:
                results = await ranked(index, [q for _, q in batch])
                for (query_id, _), hits in zip(batch, results, strict=True):
                    out = {"id": query_id, "results": [h.as_json() for h in hits]}
                    typer.echo(json.dumps(out, ensure_ascii=False))
            if len(lines) < QUERY_BATCH:
                return


def _read_lines(stream: TextIO, count: int) -> list[str]:
    lines = []
    for line in stream:
        lines.append(line)
        if len(lines) == count:
            break
    return lines


def _query_line(line: str, line_no: int) -> tuple[Any, str]:
    try:
        query = json.loads(line)
    except json.JSONDecodeError:
        raise typer.BadParameter(f"--queries line {line_no}: not JSON") from None
    if not isinstance(query, dict) or not isinstance(query.get("text"), str):
        raise typer.BadParameter(f'--queries line {line_no}: expected {{"id": ..., "text": "..."}}')
    return query.get("id"), query["text"]


def _database_call(settings: Settings, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    from trioindex.db.pool import open_database
    from trioindex.services import resolve_database_url

    async def go() -> T:
        url = await resolve_database_url(settings)
        async with open_database(url, pool_size=1) as db:
            return await db.run(fn, *args, **kwargs)

    return _run(go)


@app.command()
@friendly
def status(as_json: JsonFlag = False) -> None:
    """Jobs by status, oldest pending age, retries, failures by type, and workers."""
    settings = _settings(quiet=True)
    embedded_was_up = _embedded_running(settings)
    result = _database_call(
        settings, admin.queue_status, heartbeat_timeout=settings.worker.heartbeat_timeout
    )
    if as_json:
        payload = admin.as_json(result)
        assert isinstance(payload, dict)
        payload["workers"] = [{**admin.as_json(w), "state": w.state} for w in result.workers]  # type: ignore[dict-item]
        _print_json(payload)
        return
    typer.echo("jobs:    " + "  ".join(f"{k} {v}" for k, v in result.jobs_by_status.items()))
    age = result.oldest_pending_age_seconds
    typer.echo(f"pending: oldest {age:.1f}s ago" if age is not None else "pending: none")
    typer.echo(f"retries scheduled: {result.retries_scheduled}")
    if result.serving_model is not None:
        typer.echo(f"model:   {result.serving_model} serves search")
    if (switch := result.switch) is not None:
        typer.echo(
            f"switch:  to {switch.name}: {switch.covered}/{switch.documents} documents covered,"
            f" {switch.pending_jobs} job(s) open, {switch.failed_jobs} failed"
            " (`trioindex models list`)"
        )
    if result.failures_by_type:
        typer.echo("failures: " + "  ".join(f"{k} {v}" for k, v in result.failures_by_type.items()))
    # workers that stopped cleanly are counted, not listed (the last hour's; older ones not)
    shown = [w for w in result.workers if w.state != "STOPPED"]
    stopped = len(result.workers) - len(shown)
    typer.echo(f"workers: {len(shown)}" + (f" (and {stopped} stopped)" if stopped else ""))
    for w in shown:
        typer.echo(
            f"  {w.id}  {w.state:8} {w.hostname}:{w.pid}"
            f"  running {w.running_jobs}/{w.max_concurrency}"
            f"  heartbeat {w.heartbeat_age_seconds:.0f}s ago"
        )
    if embedded_was_up is not None:
        pgdata = settings.home.resolve() / "pgdata"
        typer.echo(
            f"database: embedded PostgreSQL under {pgdata}, running"
            " (it stops when the last trioindex process using it exits; `trioindex db stop`"
            " stops it now)"
            if embedded_was_up
            else f"database: embedded PostgreSQL under {pgdata}, started for this command only"
        )


def _embedded_running(settings: Settings) -> bool | None:
    """None with database.url set; else whether the embedded server under home is running."""
    if settings.database.url:
        return None
    return (settings.home.resolve() / "pgdata" / "postmaster.pid").exists()


db_app = typer.Typer(no_args_is_help=True, help="The embedded PostgreSQL (no database.url).")
app.add_typer(db_app, name="db")


@db_app.command("stop")
@friendly
def db_stop() -> None:
    """Stop the embedded PostgreSQL under home now, whoever started it."""
    settings = _settings(quiet=True)
    pgdata = settings.home.resolve() / "pgdata"
    running = _embedded_running(settings)
    if running is None:
        typer.echo("nothing to stop: database.url names an external PostgreSQL")
        return
    if not running:
        typer.echo(f"no embedded PostgreSQL is running under {pgdata}")
        return
    from trioindex.db.pool import stop_embedded

    stop_embedded(settings.home)
    typer.echo(f"stopped the embedded PostgreSQL under {pgdata}")


@app.command()
@friendly
def healthcheck() -> None:
    """Exit 0 when the database answers and this host's worker heartbeat is fresh."""
    settings = _settings(quiet=True)
    fresh = _database_call(
        settings,
        admin.fresh_worker_on_host,
        socket.gethostname(),
        settings.worker.heartbeat_timeout,
    )
    if not fresh:
        typer.echo(f"no fresh worker heartbeat from {socket.gethostname()}", err=True)
        raise typer.Exit(1)
    typer.echo("ok")


# --- jobs ----------------------------------------------------------------------------------------


@jobs_app.command("list")
@friendly
def jobs_list(
    status: Annotated[JobStatus | None, typer.Option(help="Only jobs in this status.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 50,
    as_json: JsonFlag = False,
) -> None:
    """List jobs, newest first."""
    settings = _settings(quiet=True)
    jobs = _database_call(settings, admin.list_jobs, status=status, limit=limit)
    if as_json:
        _print_json(jobs)
        return
    if not jobs:
        typer.echo("no jobs" + (f" with status {status.value}" if status else ""))
        return
    typer.echo(f"{'JOB':36}  {'STATUS':10} {'DONE':>4}  ATTEMPTS  DOCUMENT (VERSION)  FAILURE")
    for job in jobs:
        failure = ""
        if job.last_failure_type:
            message = " ".join((job.last_failure_message or "").split())
            failure = f"  {job.last_failure_type}" + (f": {message[:120]}" if message else "")
        typer.echo(
            f"{job.id}  {job.status:10} {job.progress:>3}%  {job.attempt_count:>3}/"
            f"{job.max_attempts:<4}  {job.document_key} (v{job.version_no}){failure}"
        )


@jobs_app.command("show")
@friendly
def jobs_show(job_id: UUID, as_json: JsonFlag = False) -> None:
    """One job with its attempts, failure types and timings."""
    settings = _settings(quiet=True)
    job = _database_call(settings, admin.show_job, job_id)
    if as_json:
        _print_json(job)
        return
    typer.echo(f"job {job.id}: {job.status} ({job.progress}%)")
    typer.echo(f"document {job.document_key} version {job.version_no} ({job.version_status})")
    typer.echo(
        f"model {job.model}, priority {job.priority},"
        f" attempts {job.attempt_count}/{job.max_attempts}"
    )
    if job.last_failure_type:
        typer.echo(f"last failure: {job.last_failure_type}: {job.last_failure_message}")
    for a in job.attempts:
        took = (
            f"{(a.finished_at - a.started_at).total_seconds():.2f}s" if a.finished_at else "running"
        )
        failure = f"  {a.failure_type}: {a.failure_message}" if a.failure_type else ""
        typer.echo(
            f"  attempt {a.attempt_no}: {a.status:9} {took:>9}  worker {a.worker_id}{failure}"
        )


@jobs_app.command("retry")
@friendly
def jobs_retry(
    job_id: Annotated[UUID | None, typer.Argument()] = None,
    all_failed: Annotated[
        bool, typer.Option("--all-failed", help="Retry every FAILED job.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Send FAILED jobs back to the queue with a fresh attempt budget."""
    if (job_id is None) == (not all_failed):
        typer.echo("trioindex: give a job id or --all-failed (not both)", err=True)
        raise typer.Exit(2)
    settings = _settings(quiet=True)

    def retry(conn: Any) -> list[Any]:
        ids = admin.failed_job_ids(conn) if job_id is None else [job_id]
        return [
            admin.retry_failed_job(conn, i, extra_attempts=settings.worker.max_attempts)
            for i in ids
        ]

    retried = _database_call(settings, retry)
    if as_json:
        _print_json(retried)
        return
    for job in retried:
        typer.echo(f"{job.id}  PENDING  {job.document_key} v{job.version_no}")
    typer.echo(f"{len(retried)} job(s) back in the queue")


# --- delete / models (the index over time) ------------------------------------------------------


@app.command()
@friendly
def delete(
    keys: Annotated[list[str] | None, typer.Argument(help="Document keys to delete.")] = None,
    prefix: Annotated[
        str | None, typer.Option(help="Also every document whose key starts with this.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Delete documents: they leave search at once, with their chunks, vectors and jobs; a
    blob no remaining version uses is removed from the store."""
    if not keys and not prefix:
        typer.echo("trioindex: give document keys or a non-empty --prefix", err=True)
        raise typer.Exit(2)
    settings = _settings(quiet=as_json)
    from trioindex.removal import DeleteReport, delete_documents
    from trioindex.services import open_services

    async def go() -> DeleteReport:
        async with open_services(settings) as services:
            return await delete_documents(services.db, services.storage, keys or [], prefix=prefix)

    report = _run(go)
    if as_json:
        _print_json(report.as_json())
    else:
        for key in report.deleted:
            typer.echo(f"deleted   {key}")
        for key in report.missing:
            typer.echo(f"not found {key}")
        typer.echo(f"{len(report.deleted)} deleted, {report.blobs_removed} blob(s) removed")
    if report.missing:
        raise typer.Exit(1)


models_app = typer.Typer(no_args_is_help=True, help="List, activate and remove embedding models.")
app.add_typer(models_app, name="models")


@models_app.command("list")
@friendly
def models_list(as_json: JsonFlag = False) -> None:
    """Every model: dimension, serving or switching, documents covered / total."""
    settings = _settings(quiet=True)
    from trioindex.db.models import model_list

    views = _database_call(settings, model_list)
    if as_json:
        _print_json(views)
        return
    for v in views:
        state = "serving" if v.serving else "switching to" if v.activating else "inactive"
        extra = f"  {v.pending_jobs} job(s) open" if v.pending_jobs else ""
        extra += f"  {v.failed_jobs} failed" if v.failed_jobs else ""
        typer.echo(
            f"{v.name}  {v.dimension} dims  {state:12} covers {v.covered}/{v.documents}{extra}"
        )


@models_app.command("activate")
@friendly
def models_activate(
    name: str,
    dimension: Annotated[
        int | None, typer.Option(min=1, max=16000, help="Needed for a new model.")
    ] = None,
    priority: Annotated[int, typer.Option(help="Priority of the switch's jobs.")] = 0,
    as_json: JsonFlag = False,
) -> None:
    """Switch search to model NAME: enqueue one job per document for it; search keeps the
    serving model until NAME covers every document, then switches in one transaction."""
    settings = _settings(quiet=True)
    from trioindex.db.models import activate_model, find_model

    def activate(conn: Any) -> Any:
        known = find_model(conn, name)
        dim = dimension or (known.dimension if known else None)
        if dim is None:
            raise ConfigError(f"model {name!r} is new: give its --dimension")
        return activate_model(
            conn, name, dim, max_attempts=settings.worker.max_attempts, priority=priority
        )

    result = _database_call(settings, activate)
    if as_json:
        _print_json(result)
        return
    if result.switched:
        typer.echo(f"{name} serves search now")
    else:
        typer.echo(
            f"switching to {name}: {result.jobs} job(s) enqueued; run a worker with"
            f" embedding.model = {name}; `trioindex models list` shows the progress"
        )


@models_app.command("remove")
@friendly
def models_remove(name: str, as_json: JsonFlag = False) -> None:
    """Drop a model that does not serve search: its vectors, jobs and HNSW index."""
    settings = _settings(quiet=True)
    from trioindex.db.models import remove_model

    removed = _database_call(settings, remove_model, name)
    if as_json:
        _print_json(removed)
        return
    typer.echo(f"removed {name}: {removed.embeddings} vector(s), {removed.jobs} job(s)")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
