"""The log setup: a buffered handler keeps lines below WARNING and writes them in order, in one
write, when a WARNING comes, when a line comes its interval after the first kept one, when its
thread finds lines kept after a pause, or when it is flushed or closed (also at exit). Records
look up nothing the formats do not show."""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from trioindex.logs import BufferedStreamHandler, JsonFormatter, configure_logging, flush_logs

#: Never reached in a test: the flusher thread stays asleep unless a test wants it.
NEVER = 3600.0


class Writes(io.StringIO):
    """A stream that records each write (and can announce the first)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []
        self.written = threading.Event()

    def write(self, text: str) -> int:
        self.writes.append(text)
        self.written.set()
        return super().write(text)


@pytest.fixture
def logger() -> Iterator[logging.Logger]:
    log = logging.getLogger("tests.test_logs")
    log.propagate = False
    log.setLevel(logging.INFO)
    yield log
    for handler in log.handlers:
        handler.close()
    log.handlers.clear()
    log.propagate = True


def buffered(
    logger: logging.Logger, interval: float = NEVER, quiet: float = NEVER
) -> tuple[Writes, BufferedStreamHandler]:
    stream = Writes()
    handler = BufferedStreamHandler(stream, interval, quiet)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    return stream, handler


def test_lines_below_warning_wait_and_a_warning_writes_them_all_in_one_write(
    logger: logging.Logger,
) -> None:
    stream, _ = buffered(logger)
    logger.info("job %d", 1)
    logger.info("job %d", 2)
    assert stream.writes == []
    logger.warning("late")
    assert stream.writes == ["INFO job 1\nINFO job 2\nWARNING late\n"]


def test_a_line_is_formatted_when_logged_not_when_written(logger: logging.Logger) -> None:
    stream, handler = buffered(logger)
    outcome = ["done"]
    logger.info("outcome %s", outcome)
    outcome[0] = "changed"
    handler.flush()
    assert stream.getvalue() == "INFO outcome ['done']\n"


def test_flush_and_close_write_what_is_kept_and_close_stops_keeping(
    logger: logging.Logger,
) -> None:
    stream, handler = buffered(logger)
    logger.info("one")
    handler.flush()
    assert stream.writes == ["INFO one\n"]
    handler.flush()  # nothing kept: no empty write
    logger.info("two")
    handler.close()
    assert stream.writes == ["INFO one\n", "INFO two\n"]
    logger.info("three")  # a closed handler writes at once
    assert stream.writes[-1] == "INFO three\n"


def test_a_line_its_interval_after_the_first_writes_the_kept_lines(
    logger: logging.Logger,
) -> None:
    stream, _ = buffered(logger, interval=0.0)  # every line is "late": written as it comes
    logger.info("one")
    assert stream.writes == ["INFO one\n"]
    logger.info("two")
    assert stream.writes == ["INFO one\n", "INFO two\n"]


def test_the_flusher_thread_writes_kept_lines_without_another_record(
    logger: logging.Logger,
) -> None:
    stream, _ = buffered(logger, quiet=0.0)
    logger.info("alone")
    assert stream.written.wait(timeout=30), "the kept line was never written"
    # the thread wrote it (under the handler's lock, so the write is complete)
    assert stream.writes[0] == "INFO alone\n"


def test_configure_logging_buffered_and_flush_logs(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        configure_logging("json", logging.INFO, buffered=True)
        (handler,) = root.handlers
        assert isinstance(handler, BufferedStreamHandler)
        handler.interval = handler.quiet = NEVER  # its thread is idle: nothing written before
        logging.getLogger("trioindex.x").info("kept")
        configure_logging("text", logging.INFO)  # the replaced handler writes what it kept
        assert json.loads(capsys.readouterr().err)["message"] == "kept"
        assert not isinstance(root.handlers[0], BufferedStreamHandler)
        flush_logs()  # a plain handler: no effect, no error
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)


EXITS = """
import logging, sys
from trioindex.logs import configure_logging
configure_logging("text", logging.INFO, buffered=True)
handler = logging.getLogger().handlers[0]
handler.interval = handler.quiet = 3600.0  # only the exit writes the lines
log = logging.getLogger("exit")
for n in range(3):
    log.info("line %d", n)
if sys.argv[1] == "raise":
    raise RuntimeError("boom")
if sys.argv[1] == "exit":
    sys.exit(3)
"""


@pytest.mark.parametrize(("how", "code"), [("return", 0), ("raise", 1), ("exit", 3)])
def test_lines_kept_at_exit_are_written(tmp_path: Path, how: str, code: int) -> None:
    script = tmp_path / "exits.py"
    script.write_text(EXITS)
    done = subprocess.run(
        [sys.executable, str(script), how],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == code, done.stderr
    lines = [line for line in done.stderr.splitlines() if " exit: line " in line]
    assert [line.rsplit(" ", 1)[1] for line in lines] == ["0", "1", "2"], done.stderr


def test_json_formatter_names_the_error_type_only() -> None:
    try:
        raise ValueError("secret detail")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    payload = json.loads(JsonFormatter().format(record))
    assert payload["error"] == "ValueError"
    assert "secret detail" not in json.dumps(payload)


RECORD_FIELDS = """
import logging, threading
from trioindex.logs import configure_logging
configure_logging(__import__("sys").argv[1], logging.INFO)
seen = []
class Keep(logging.Filter):
    def filter(self, record):
        seen.append(record)
        return True
log = logging.getLogger("trioindex.worker.job")
log.addFilter(Keep())
threading.current_thread().name = "slot"
log.info("worker %s job %s: %s after %.2fs", "w1", "j1", "succeeded", 0.0123)
(record,) = seen
print(record.lineno, record.threadName, record.processName, record.process, flush=True)
"""


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_lines_say_what_they_said_without_caller_thread_or_process_lookups(fmt: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", RECORD_FIELDS, fmt], capture_output=True, text=True, check=True
    )
    # what neither format shows is not looked up for any record
    assert done.stdout.split() == ["0", "None", "None", "None"]
    line = done.stderr.strip()
    if fmt == "json":
        payload = json.loads(line)
        assert (payload["level"], payload["logger"]) == ("info", "trioindex.worker.job")
        assert payload["message"] == "worker w1 job j1: succeeded after 0.01s"
    else:
        assert re.fullmatch(
            r"\d\d:\d\d:\d\d INFO    trioindex\.worker\.job: worker w1 job j1: succeeded after"
            r" 0\.01s",
            line,
        ), line
