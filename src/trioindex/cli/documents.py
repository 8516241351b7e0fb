"""Commands over documents: ``ingest`` (upload and enqueue, ``--sync``), ``search`` (documents
or chunks, one query or JSON lines), ``delete`` and ``documents list``."""

from __future__ import annotations

import functools
import io
import json
import logging
import math
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TextIO

import typer

from trioindex.cli.common import (
    JsonFlag,
    app,
    command_settings,
    database_call,
    friendly,
    print_json,
    priority_option,
    run,
)
from trioindex.config import Settings

if TYPE_CHECKING:  # the database layer loads psycopg: imported by the commands that use it
    from trioindex.api.reports import IngestReport
    from trioindex.db.operations.document_views import ModelState

# --- ingest --------------------------------------------------------------------------------------


@app.command()
@friendly
def ingest(
    paths: Annotated[
        list[Path],
        typer.Argument(
            metavar="PATH...", help="Files or folders (recursive), or s3://BUCKET/PREFIX."
        ),
    ],
    *,
    wait: Annotated[bool, typer.Option(help="Wait until every job ends; show progress.")] = False,
    priority: Annotated[int, priority_option("Higher runs first.")] = 0,
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
            help="Also delete the documents each folder's ingests found whose files are gone.",
        ),
    ] = False,
    include: Annotated[
        list[str] | None,
        typer.Option(
            metavar="GLOB",
            help="Only files matching this (`*.md`; with a / the path below the folder:"
            " `notes/*`); repeat.",
        ),
    ] = None,
    exclude: Annotated[
        list[str] | None,
        typer.Option(metavar="GLOB", help="Leave out files matching this (as --include); repeat."),
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Also list the files that did not change.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Upload files and enqueue one indexing job per new or changed document.

    An `s3://BUCKET/PREFIX` argument registers the objects already in the configured bucket
    in place (keys are the object names; nothing is uploaded; unchanged objects are not read).

    A document's key is its path relative to the current folder (`ingest a/` → `a/README.md`);
    a folder outside it is keyed from itself, unless --as gives the prefix. A folder keeps
    the keys of its first ingest from any folder (until --as gives others). Files of a format
    trioindex does not index (images, archives, programs) are skipped. One line per file that
    changed (--verbose: every file), then counts. A file that cannot be ingested is reported
    and the rest go on; the exit code is 1 when any was. --sync then deletes the
    documents the folder's ingests found that have no file any more.
    """
    if key_as is not None and not key_as.strip().strip("/"):
        raise typer.BadParameter("--as needs a non-empty key")
    from trioindex.ingest.bucket import bucket_location
    from trioindex.ingest.discover import check_arguments

    # a missing path is one line, before anything is opened (s3:// arguments are listed later)
    check_arguments([p for p in paths if bucket_location(p) is None])
    settings = command_settings(quiet=as_json, storage=True)
    # the lines below say what happened to each file; the ingest's own per-file log lines
    # would say it a second time
    logging.getLogger("trioindex.ingest").setLevel(logging.WARNING)
    if not as_json:
        # before anything is uploaded (s3:// arguments are keyed by their object names)
        _outside_note([p for p in paths if bucket_location(p) is None], key_as)
    from trioindex.api.index import Index

    async def go() -> IngestReport:
        async with Index.open(settings) as index:
            report = await index.ingest(
                paths,
                priority=priority,
                follow_symlinks=follow_symlinks,
                key_as=key_as,
                sync=sync,
                include=include or (),
                exclude=exclude or (),
            )
            _print_entries(list(report.entries), as_json=as_json, verbose=verbose, sync=sync)
            return await index.wait(report, show_progress=not as_json) if wait else report

    report = run(go)
    errors = sum(1 for e in report.entries if e.status == "error")
    if errors:
        typer.echo(f"trioindex: {errors} file(s) could not be ingested (see above)", err=True)
    for failed in report.failures:
        reason = " ".join((failed.message or "").split())[:200]
        typer.echo(
            f"FAILED {failed.document_key}: {failed.failure_type}"
            + (f": {reason}" if reason else ""),
            err=True,
        )
    for key in report.removed:
        typer.echo(f"removed {key}: deleted while waiting, not indexed", err=True)
    if wait and not as_json:
        typer.echo(_wait_summary(report))
    if report.failures or errors:
        raise typer.Exit(1)


def _print_entries(entries: list[Any], *, as_json: bool, verbose: bool, sync: bool) -> None:
    """One JSON object per file with --json; else one line per file that changed (every file
    with --verbose) and the counts."""
    for entry in entries:
        if as_json:
            typer.echo(json.dumps(entry.as_json()))
        elif verbose or entry.status != "unchanged":
            typer.echo(_ingest_line(entry))
    if not as_json:
        typer.echo(_ingest_summary(entries, sync=sync))


def _wait_summary(report: IngestReport) -> str:
    """``indexed: 10 succeeded, 1 failed`` (+ ``2 removed``) for the jobs waited for."""
    waited = len(report.queued)
    failed, removed = len(report.failures), len(report.removed)
    parts = [f"{waited - failed - removed} succeeded", f"{failed} failed"]
    parts += [f"{removed} removed"] if removed else []
    return "indexed: " + ", ".join(parts)


def _outside_note(paths: list[Path], key_as: str | None) -> None:
    """Say when a folder outside the current one may be keyed from itself (the first time it
    is ingested; later runs keep its recorded keys): files of the same names in another such
    folder would be new versions of these documents."""
    from trioindex.ingest.discover import keyed_by_itself

    for folder in [] if key_as is not None else keyed_by_itself(paths):
        typer.echo(
            f"note: {folder} is outside the current folder: unless it was ingested before, "
            "its keys start below it, like another such folder's files of the same names; "
            "give --as NAME to keep them apart",
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
        Path | None,
        typer.Option(
            metavar="FILE|-",
            help='Many queries: JSON lines {"id", "text"} in, JSON lines {"id", "results"} '
            '(or {"id", "error"}) out.',
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Search the current version of every document: documents with their best chunks."""
    from trioindex.search import SEARCH_MODES, QueryRefused, json_text

    if (text is None) == (queries is None):
        raise typer.BadParameter("give a query TEXT or --queries FILE|- (not both)")
    if text is not None and not text.strip():
        raise typer.BadParameter("the query is empty: give words to look for")
    if mode not in SEARCH_MODES:
        raise typer.BadParameter(f"--mode must be one of {', '.join(SEARCH_MODES)}")
    settings = command_settings(quiet=True, storage=True)
    from trioindex.api.index import Index

    options: dict[str, Any] = {
        "top_k": top_k,
        "mode": mode,  # checked against SEARCH_MODES
        "key_prefix": prefix,
        "content_types": tuple(content_type or ()),
    }

    def ranked(index: Index, texts: list[str]) -> Awaitable[list[Any]]:
        if chunks:
            return index.search_chunks_many(texts, **options)
        return index.search_many(texts, chunks_per_document=chunks_per_document, **options)

    if queries is not None:
        with _query_stream(queries) as stream:
            count, refused = run(functools.partial(_search_query_lines, settings, stream, ranked))
        if refused:
            typer.echo(
                f"trioindex: {refused} of {count} queries refused (see their errors)", err=True
            )
            raise typer.Exit(1)
        return
    assert text is not None

    async def go() -> list[Any]:
        async with Index.open(settings) as index:
            (hits,) = await ranked(index, [text])
            if isinstance(hits, QueryRefused):
                raise hits
            return list(hits)

    hits = run(go)
    if as_json:
        typer.echo(json_text([h.as_json() for h in hits], indent=2))
        return
    if not hits:
        typer.echo("no results (is anything indexed yet? try `trioindex status`)")
    for hit in hits:
        if chunks:
            typer.echo(f"{hit.rank:>3}. {hit.score:.4f}  {hit.document_key} #{hit.chunk_index}")
            typer.echo(f"     {hit.passage().styled()}")  # bold: a terminal only
            continue
        typer.echo(f"{hit.rank:>3}. {hit.score:.4f}  {hit.document_key}  (v{hit.version_no})")
        for c in hit.chunks:
            typer.echo(f"       #{c.chunk_index:<4} {c.score:.4f}  {c.passage(120).styled()}")


#: Queries embedded and ranked together by `search --queries`.
QUERY_BATCH = 64


async def _search_query_lines(
    settings: Settings,
    stream: TextIO,
    ranked: Callable[[Any, list[str]], Awaitable[list[Any]]],
) -> tuple[int, int]:
    """`search --queries`: read JSON lines in batches, print one JSON line per query: its
    results, or an error object for a line that is not a query or a query that was refused.
    Returns how many queries there were and how many were refused."""
    import trio

    from trioindex.api.index import Index
    from trioindex.search import QueryRefused, json_text

    count = refused = 0
    async with Index.open(settings) as index:
        line_no = 0
        while True:
            lines = await trio.to_thread.run_sync(_read_lines, stream, QUERY_BATCH)
            batch = []
            for line in lines:
                line_no += 1
                if line.strip():
                    batch.append(_query_line(line, line_no))
            texts = [q for _, q in batch if isinstance(q, str)]
            answers = iter(await ranked(index, texts) if texts else [])
            for query_id, query in batch:
                answer = query if isinstance(query, QueryRefused) else next(answers)
                if isinstance(answer, QueryRefused):
                    out = {"id": query_id, "error": answer.as_json()}
                    refused += 1
                else:
                    out = {"id": query_id, "results": [h.as_json() for h in answer]}
                typer.echo(json_text(out))
            count += len(batch)
            if len(lines) < QUERY_BATCH:
                return count, refused


def _query_stream(queries: Path) -> TextIO:
    """The ``--queries`` file, or stdin for ``-``, without a leading byte order mark; bytes that
    are not UTF-8 are kept as lone surrogates, so that search refuses the query holding them
    (:func:`trioindex.search.prepare_query`) and an ``id`` holding them comes back escaped."""
    if str(queries) != "-":
        return open(queries, encoding="utf-8-sig", errors="surrogateescape")
    if isinstance(sys.stdin, io.TextIOWrapper):
        sys.stdin.reconfigure(encoding="utf-8-sig", errors="surrogateescape")
    return sys.stdin


def _read_lines(stream: TextIO, count: int) -> list[str]:
    lines = []
    for line in stream:
        lines.append(line)
        if len(lines) == count:
            break
    return lines


def _query_line(line: str, line_no: int) -> tuple[Any, Any]:
    """A line's ``(id, text)``, or ``(id, QueryRefused)`` for a line that is not a query."""
    from trioindex.search import QueryRefused

    try:
        query = json.loads(line, parse_constant=_not_json, parse_float=_finite)
    except (ValueError, RecursionError):  # JSONDecodeError, NaN, 1e999, 5000 digits, [[[[...
        return None, QueryRefused(f"--queries line {line_no}: not JSON")
    if not isinstance(query, dict) or not isinstance(query.get("text"), str):
        expected = f'--queries line {line_no}: expected {{"id": ..., "text": "..."}}'
        return query.get("id") if isinstance(query, dict) else None, QueryRefused(expected)
    return query.get("id"), query["text"]


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _finite(number: str) -> float:
    value = float(number)
    if not math.isfinite(value):
        raise ValueError("a number beyond float64")
    return value


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
    settings = command_settings(quiet=as_json, storage=True)
    from trioindex.removal import DeleteReport, delete_documents
    from trioindex.services import open_services

    async def go() -> DeleteReport:
        async with open_services(settings) as services:
            return await delete_documents(services.db, services.storage, keys or [], prefix=prefix)

    report = run(go)
    if as_json:
        print_json(report.as_json())
    else:
        for key in report.deleted:
            typer.echo(f"deleted   {key}")
        for key in report.missing:
            typer.echo(f"not found {key}")
        typer.echo(f"{len(report.deleted)} deleted, {report.blobs_removed} blob(s) removed")
    if report.missing:
        raise typer.Exit(1)


# --- documents list ------------------------------------------------------------------------------

documents_app = typer.Typer(no_args_is_help=True, help="List documents and their indexing state.")
app.add_typer(documents_app, name="documents")


@documents_app.command("list")
@friendly
def documents_list(
    prefix: Annotated[
        str | None, typer.Option(help="Only documents whose key starts with this (a folder).")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=100_000)] = 100,
    as_json: JsonFlag = False,
) -> None:
    """Documents by key: the newest version and, per model, its job's state for that version
    and the version the model serves."""
    settings = command_settings(quiet=True)
    from trioindex.db.operations.document_views import count_documents, list_documents

    page = database_call(settings, list_documents, prefix=prefix or "", limit=limit)
    if as_json:
        print_json(list(page.documents))
        return
    if not page.documents:
        typer.echo("no documents" + (f" under {prefix}" if prefix else ""))
        return
    width = max(len(d.key) for d in page.documents)
    for doc in page.documents:
        newest = doc.versions[0]
        states = "  ".join(_model_state(m, newest.version_no) for m in newest.models)
        typer.echo(f"{doc.key:{width}}  v{newest.version_no:<3} {states}".rstrip())
    if page.next_after is not None:
        total = database_call(settings, count_documents, prefix=prefix or "")
        typer.echo(f"{len(page.documents)} of {total} documents (--limit shows more)")


def _model_state(state: ModelState, newest: int) -> str:
    """``MODEL: SUCCEEDED`` (serving the newest version), ``MODEL: PENDING, serves v2``,
    ``MODEL: FAILED DOCUMENT_CONTENT_INVALID, serves nothing``."""
    job = "no job" if state.job_status is None else str(state.job_status)
    if state.failure_type and state.job_status == "FAILED":
        job += f" {state.failure_type}"
    if state.served_version_no == newest:
        return f"{state.model}: {job}"
    served = "nothing" if state.served_version_no is None else f"v{state.served_version_no}"
    return f"{state.model}: {job}, serves {served}"
