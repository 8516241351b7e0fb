"""The parse step's CPU-bound half, run in a worker process that can be killed.

Owns the process boundary of the parse step (docs/design/architecture.md, "Parse + chunk"): the
stored bytes go in, the chunks come out
(:class:`ParsedDocument`), and nothing else crosses — no database, storage or lock. Extraction
and chunking are synchronous library code (pypdf, lxml, python-docx, a Rust splitter) that a
thread cannot interrupt; a hostile file could hold a job slot for hours and keep the worker
from stopping. Here they run in a ``trio-parallel`` worker process instead:

* cancelling the caller (shutdown after the grace period, a lost lease) kills the process
  (SIGKILL) and returns at once;
* ``indexing.parsing.timeout`` bounds one document: past it the process is killed and the
  document fails ``DOCUMENT_CONTENT_INVALID``, naming the limit;
* the CPU work leaves the worker's GIL, so other jobs' database and HTTP work keeps going.

Start-up cost: a worker process imports this module (and the parsers) once (~0.5 s), then
trio-parallel keeps it for the next document: its default context, configured by
:func:`_configure_workers` on the first parse (workers idle up to 10 minutes, killed ones are
replaced on demand, one that peaked above :data:`RETIRE_ABOVE_RSS` is retired after its parse,
all are shut down at interpreter exit). The
:class:`~trioindex.pipeline.chunking.Chunker` pickles as its policy and tokenizer and is rebuilt
once per process.

Logs: a worker process logs like its parent (same format and level, same stream) and writes
nothing else to stderr — if the parent is killed in the middle of handing over a document, the
orphan's "end of file during message" traceback must not land in the worker's log.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
import resource
import sys

import attrs
import trio

# trio-parallel ships no type hints.
import trio_parallel  # type: ignore[import-untyped]

from trioindex.errors import ContentInvalid, StepFailure, StorageUnavailable
from trioindex.logs import JsonFormatter, configure_logging
from trioindex.pipeline.chunk_values import ChunkDraft
from trioindex.pipeline.chunking import Chunker
from trioindex.pipeline.formats import DEFAULT_OCR, DocumentFormat, OcrPolicy, extract_text

__all__ = [
    "DEFAULT_TIMEOUT",
    "ParseRequest",
    "ParsedDocument",
    "parse_document",
    "parse_in_process",
]

DEFAULT_TIMEOUT = 300.0  # the default of indexing.parsing.timeout, in seconds
# A worker process whose peak memory passed this is retired after its parse, rather than holding
# that memory while idle.
RETIRE_ABOVE_RSS = 512 * 1024 * 1024
_IDLE_TIMEOUT = 600.0
_EXIT_GRACE = 5.0


@attrs.frozen
class ParseRequest:
    """What a parse is given across the process boundary: the stored bytes and their facts."""

    data: bytes = attrs.field(repr=False)
    sha256: str
    name: str
    content_type: str | None
    max_bytes: int
    ocr: bool = True  # indexing.parsing.ocr: scanned PDFs and images read by OCR (or refused)
    # indexing.parsing.ocr-low-confidence: a page read with a mean word confidence under it is
    # marked, and the version with it
    ocr_low_confidence: float = DEFAULT_OCR.low_confidence
    # the format detect_format gave for these bytes, name and type, when the caller asked first
    detected: DocumentFormat | None = None


@attrs.frozen
class ParsedDocument:
    """What a parse returns across the process boundary."""

    chunks: list[ChunkDraft] = attrs.field(repr=False)
    format: DocumentFormat
    replaced: int = 0  # invalid byte sequences decoded as U+FFFD (see trioindex.pipeline.formats)
    low_confidence_pages: tuple[int, ...] = ()  # the pages OCR read with low confidence


def parse_document(request: ParseRequest, chunker: Chunker) -> ParsedDocument:
    """Verify the bytes against their sha256, extract the text and chunk it (synchronous)."""
    data = request.data
    if hashlib.sha256(data).hexdigest() != request.sha256:
        raise StorageUnavailable(
            "the stored object does not match the version's sha256 (corrupt or replaced)"
        )
    extracted = extract_text(
        data,
        request.name,
        request.content_type,
        max_bytes=request.max_bytes,
        ocr=OcrPolicy(enabled=request.ocr, low_confidence=request.ocr_low_confidence),
        detected=request.detected,
    )
    chunks = chunker.chunk(extracted.text)
    if not chunks:
        raise ContentInvalid("the document has no text to index")
    return ParsedDocument(
        chunks=chunks,
        format=extracted.format,
        replaced=extracted.replaced,
        low_confidence_pages=extracted.low_confidence_pages,
    )


def _seconds(value: float) -> str:
    return f"{value:g} s"


async def parse_in_process(
    request: ParseRequest,
    chunker: Chunker,
    *,
    time_limit: float = DEFAULT_TIMEOUT,
    limiter: trio.CapacityLimiter | None = None,
) -> ParsedDocument:
    """:func:`parse_document` in a worker process, killed on cancellation or after
    ``time_limit`` seconds (then :class:`ContentInvalid` naming ``indexing.parsing.timeout``).

    ``limiter`` bounds concurrent parses; waiting for it does not count against the limit
    (a queue of hostile files must not time out the normal one behind them).
    """
    if not time_limit > 0 or math.isnan(time_limit):
        raise ValueError("time_limit must be > 0")
    _configure_workers()
    async with limiter if limiter is not None else trio.CapacityLimiter(1):
        with trio.move_on_after(time_limit):
            try:
                result: ParsedDocument = await trio_parallel.run_sync(
                    parse_document,
                    request,
                    chunker,
                    kill_on_cancel=True,
                    # the caller's limiter is held already; trio-parallel's own would cap
                    # the whole worker at one parse per CPU
                    limiter=trio.CapacityLimiter(1),
                )
            except trio_parallel.BrokenWorkerError as exc:
                # Killed from outside (e.g. by the kernel for memory) or crashed in C code.
                # Retryable as an internal error: the next attempt may run with more room.
                raise StepFailure(f"the parse process died ({_exit_status(exc)})") from None
            return result
    raise ContentInvalid(
        f"parsing took longer than indexing.parsing.timeout ({_seconds(time_limit)})"
    )


def _exit_status(exc: BaseException) -> str:
    process = exc.args[-1] if exc.args else None
    code = getattr(process, "exitcode", None)
    if code is None:
        return "no exit status"
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


# -- worker processes ---------------------------------------------------------------------------


@functools.cache
def _configure_workers() -> None:
    """Configure trio-parallel's default context once per process, before its first worker.

    (trio-parallel requires the main thread; Trio tasks run there.)
    """
    root = logging.getLogger()
    json = any(isinstance(h.formatter, JsonFormatter) for h in root.handlers)
    trio_parallel.configure_default_context(
        idle_timeout=_IDLE_TIMEOUT,
        init=functools.partial(_start_worker, "json" if json else "text", root.level),
        retire=_retire_worker,
        grace_period=_EXIT_GRACE,
    )


def _start_worker(log_format: str, level: int) -> bool:
    """In a new worker process: log like the parent, and keep stderr for log lines only."""
    configure_logging(log_format, level)  # its handler keeps the inherited stderr stream
    logging.captureWarnings(True)
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115  (for the life of the process)
    return True


def _retire_worker() -> bool:
    """After each parse, in the worker process: retire it if it ever grew past the limit."""
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return peak_kib * 1024 > RETIRE_ABOVE_RSS
