"""Reach a path below a folder name by name, from the folder's descriptor, never through a link.

Each folder step is ``os.open(name, O_DIRECTORY | O_NOFOLLOW, dir_fd=parent)`` and the file
itself is opened with ``O_NOFOLLOW``, so a name turned into a symbolic link (or into a file)
between two steps makes that step fail instead of leading out of the folder. Only the starting
folder is opened by its path, following links: a folder the run was given, resolved, or with
``follow_symlinks`` where a link the walk resolved leads. The walk (:mod:`.discover`) lists
every folder through such a descriptor and each file is opened through one
(:func:`trioindex.ingest.files.open_source`); both then compare ``(st_dev, st_ino)`` with what
they expected (:func:`identity`).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

__all__ = [
    "FILE_FLAGS",
    "Identity",
    "change",
    "folder",
    "identity",
    "lstat_below",
    "open_file",
]

Identity = tuple[int, int]  # (st_dev, st_ino): one file or folder, whatever its name

_START_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_FOLDER_FLAGS: Final = _START_FLAGS | os.O_NOFOLLOW
# O_NONBLOCK: a FIFO put in the file's place must not hang the run (no effect on regular files).
FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

# What an OSError of a step means when the path changed under the run, rather than being
# unreadable. A link (or a file) where a folder was gives ENOTDIR (O_DIRECTORY wins over
# O_NOFOLLOW on Linux); a link where the file was gives ELOOP.
_CHANGES: Final = {
    errno.ENOENT: "it, or a folder on its path, is gone",
    errno.ENOTDIR: "a symbolic link or a file took the place of a folder on its path",
    errno.ELOOP: "a symbolic link took its place",
}


def identity(st: os.stat_result) -> Identity:
    return st.st_dev, st.st_ino


def change(exc: OSError) -> str | None:
    """How the path changed while the run read it (gone, a link or a file where a folder was,
    a link where the file was), or None when ``exc`` is another error (permissions, I/O)."""
    return _CHANGES.get(exc.errno) if exc.errno is not None else None


@contextlib.contextmanager
def folder(start: Path, parts: Sequence[str]) -> Iterator[int]:
    """A descriptor of the folder ``start/parts…``: ``start`` opened by its path, then each of
    ``parts`` from the one before without following a link; closed when the block ends."""
    fd = os.open(start, _START_FLAGS)
    try:
        for part in parts:
            step = os.open(part, _FOLDER_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = step
        yield fd
    finally:
        os.close(fd)


def open_file(start: Path, parts: Sequence[str]) -> int:
    """A descriptor of the file ``start/parts…`` (``parts`` ends with its name), its folder
    reached as :func:`folder` reaches it and the file opened with :data:`FILE_FLAGS`; the
    caller closes it."""
    *folders, name = parts
    with folder(start, folders) as parent:
        return os.open(name, FILE_FLAGS, dir_fd=parent)


def lstat_below(start: Path, parts: Sequence[str]) -> os.stat_result:
    """The ``lstat`` of ``start/parts…``, its folder reached as :func:`folder` reaches it
    (``parts`` empty: ``start`` itself, following links as :func:`folder` does)."""
    if not parts:
        return os.stat(start)
    *folders, name = parts
    with folder(start, folders) as parent:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
