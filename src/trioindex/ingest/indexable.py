"""Files that are not documents are left out at ingest, by the parser's own judgement.

Before anything is uploaded, each file is shown to the same format detection the parse step
runs (:func:`trioindex.pipeline.formats.detect_format`, on the whole file and with the content
type ingest stores for it). A file it refuses as an *unsupported format* (an image, an archive,
a program, ...) becomes a ``skipped`` entry naming what it is, instead of a job that could only
fail; every other verdict is left to the parse step, which gives it with the document's job
(a corrupt PDF, an empty file). Which formats are read is therefore said in one place: a format
the detection learns is ingested from then on.

A file larger than ``max_bytes`` (``indexing.parsing.max-document-size``) is not read here: the
parse step refuses it for its size. A file that cannot be opened is left to the upload, which
reports it.
"""

from __future__ import annotations

import mimetypes
import os

import attrs

from trioindex.errors import ContentInvalid
from trioindex.ingest.discover import Discovery, SourceFile
from trioindex.ingest.files import open_source
from trioindex.ingest.results import FileNotIngested, SkippedFile, printable

__all__ = ["UNSUPPORTED", "not_a_document", "skip_non_documents"]

#: How the format detection begins the reason for a format it does not read.
UNSUPPORTED = "unsupported format"


def skip_non_documents(found: Discovery, *, max_bytes: int) -> Discovery:
    """``found`` with each file that is not a document replaced by its ``skipped`` entry."""
    entries: list[SourceFile | SkippedFile] = []
    for entry in found.entries:
        reason = None
        if isinstance(entry, SourceFile):
            reason = not_a_document(entry, max_bytes=max_bytes)
        if reason is None:
            entries.append(entry)
            continue
        assert isinstance(entry, SourceFile)
        why = f"not a document trioindex indexes ({reason})"
        entries.append(SkippedFile(printable(entry.path), entry.document_key, "skipped", why))
    return attrs.evolve(found, entries=entries)


def not_a_document(source: SourceFile, *, max_bytes: int) -> str | None:
    """The detection's reason when ``source`` is of a format trioindex does not index, else
    None (a document, or a verdict the parse step gives)."""
    from trioindex.pipeline.formats import detect_format

    try:
        handle = open_source(source)
    except FileNotIngested:
        return None
    with handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0 or size > max_bytes:
            return None
        data = handle.read(size)
    name = source.path.name
    try:
        detect_format(data, name, mimetypes.guess_type(name)[0])
    except ContentInvalid as exc:
        reason = str(exc)
        return reason if reason.startswith(UNSUPPORTED) else None
    return None
