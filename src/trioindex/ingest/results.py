"""What a run reports for each file: an :class:`IngestResult` (defined with the enqueue that
makes it, :mod:`trioindex.db.enqueue`) or a :class:`SkippedFile`; and,
with ``sync``, a :class:`DeletedDocument` for each document whose file is gone.

Also the two reasons one file is not ingested (:class:`FileNotIngested`, :class:`FileChanged`),
which the run turns into ``error`` entries, and :func:`printable`, how a path is shown.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs

from trioindex.db.enqueue import IngestResult
from trioindex.errors import TrioindexError

__all__ = [
    "DeletedDocument",
    "FileChanged",
    "FileNotIngested",
    "IngestEntry",
    "IngestResult",
    "SkippedFile",
    "printable",
]


@attrs.frozen
class SkippedFile:
    """A file (or folder) the run did not ingest, and why.

    ``status`` is ``skipped`` when a rule left it out (a symbolic link leading outside the
    folder, a folder already walked, something that is not a regular file) and ``error`` when
    it could not be ingested (a name that is not UTF-8, unreadable, changed while being read);
    the CLI exits non-zero when any entry is an ``error``. ``path`` is printable (bytes that
    are not UTF-8 are shown as ``\\xff``); ``document_key`` is None when the name is no valid
    key. Never carries file contents.
    """

    path: str
    document_key: str | None
    status: str
    reason: str

    def as_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "document_key": self.document_key,
            "status": self.status,
            "reason": self.reason,
        }


@attrs.frozen
class DeletedDocument:
    """A document ``ingest --sync`` deleted: the folder held it (under its key root) and the
    walk of the folder found no file with its key."""

    document_key: str
    path: None = None
    status: str = "deleted"
    reason: str = "its file is gone"

    @property
    def change(self) -> str:
        return self.status

    def as_json(self) -> dict[str, object]:
        return {
            "path": None,
            "document_key": self.document_key,
            "status": self.status,
            "change": self.status,
        }


IngestEntry = IngestResult | SkippedFile | DeletedDocument


class FileNotIngested(TrioindexError):
    """One file could not be ingested; ``ingest_paths`` reports it and goes on."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class FileChanged(FileNotIngested):
    """The bytes read for the upload are not the bytes that were hashed."""

    def __init__(self) -> None:
        super().__init__("the file changed while it was being read")


def printable(path: Path | str) -> str:
    """``path`` as text that can always be printed: undecodable bytes become ``\\xNN``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")
