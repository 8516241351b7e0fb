"""What a run covers: files named directly, and every visible file under the folders named.

Owns the document key rule (:func:`argument_key`: relative to the current directory, so
``ingest a/`` and ``ingest b/`` can never make one file a version of the other), the rules for
what is left out
(hidden names, names that are not UTF-8, anything not a regular file) and the symbolic link
rules: a link inside a folder is followed only when it stays inside that folder (unless
``follow_symlinks``), and every folder is walked at most once, so links cannot make the walk
loop. Anything wrong with one entry becomes a :class:`SkippedFile`, never an exception.
"""

from __future__ import annotations

import os
import stat
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import attrs

from trioindex.errors import TrioindexError
from trioindex.ingest.results import SkippedFile, printable

__all__ = [
    "MAX_KEY_CHARS",
    "Discovery",
    "KeyCollision",
    "SourceFile",
    "argument_key",
    "discover",
    "keyed_by_itself",
]

MAX_KEY_CHARS: Final = 1024  # the CHECK on documents.external_key


def _is_text(name: str) -> bool:
    # Undecodable bytes in a file name arrive as lone surrogates (surrogateescape), which
    # PostgreSQL text cannot hold.
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@attrs.frozen
class SourceFile:
    """A file to ingest. ``inside``: the resolved folder it must still be in when it is opened
    (None for a file named directly, or with ``follow_symlinks``)."""

    path: Path
    document_key: str
    inside: Path | None = None


@attrs.frozen
class Discovery:
    """Everything a run covers, in a stable order: files and the entries left out."""

    entries: list[SourceFile | SkippedFile]

    @property
    def files(self) -> list[SourceFile]:
        return [e for e in self.entries if isinstance(e, SourceFile)]

    @property
    def skipped(self) -> list[SkippedFile]:
        return [e for e in self.entries if isinstance(e, SkippedFile)]


class KeyCollision(TrioindexError):
    """Two different files of one run would get the same document key (nothing was ingested)."""


def argument_key(argument: Path, *, cwd: Path | None = None, key_as: str | None = None) -> str:
    """The document key of an ``ingest`` argument itself; a folder's files get
    ``KEY/path/below/it`` (just ``path/below/it`` when KEY is ``""``). The one key rule:

    * ``key_as`` (``--as``) given: that key, slashes at either end removed;
    * an argument inside the current directory ``cwd``: its path relative to ``cwd``, made
      absolute lexically (``..`` folded, links kept as named), so ``ingest a/`` keys
      ``a/README.md`` and ``ingest b/`` keys ``b/README.md`` (``ingest .``: ``README.md``);
    * an argument outside ``cwd``: keyed by itself, as its own root: a folder's files by their
      path below it, a file by its name (:func:`keyed_by_itself` says which arguments those
      are, so the command can say that another folder's files of the same names would be
      versions of the same documents).
    """
    if key_as is not None:
        key = key_as.strip().strip("/")
        if not key:
            raise ValueError("--as needs a non-empty key")
        return key
    base = Path(os.path.abspath(Path.cwd() if cwd is None else cwd))
    path = Path(os.path.abspath(base / argument))
    if path.is_relative_to(base):
        return path.relative_to(base).as_posix() if path != base else ""
    return "" if path.is_dir() else path.name


def keyed_by_itself(paths: Sequence[Path], *, cwd: Path | None = None) -> list[Path]:
    """The folder arguments outside ``cwd`` (without ``--as`` their keys start below them)."""
    base = Path(os.path.abspath(Path.cwd() if cwd is None else cwd))
    return [
        p for p in paths if p.is_dir() and not Path(os.path.abspath(base / p)).is_relative_to(base)
    ]


def discover(
    paths: Sequence[Path],
    *,
    follow_symlinks: bool = False,
    cwd: Path | None = None,
    key_as: str | None = None,
) -> Discovery:
    """Files named directly, and every regular file under folders (recursively, sorted by key).

    Keys follow :func:`argument_key` (``cwd``: default the working directory). Hidden files
    and folders (``.git``, ``.DS_Store``) are left out. A symbolic link inside a folder is
    followed only when its target is inside that folder, unless ``follow_symlinks``; every
    folder is walked at most once, so links cannot make the walk loop. Paths named directly are
    always followed. A missing argument raises ``FileNotFoundError``; two different files with
    one key (``--as`` over several arguments, say) raise :class:`KeyCollision` before anything
    is read; anything wrong with one entry of a folder becomes a :class:`SkippedFile`.
    """
    entries: list[SourceFile | SkippedFile] = []
    for root in paths:
        key = argument_key(root, cwd=cwd, key_as=key_as)
        if root.is_dir():
            entries.extend(_FolderWalk(root, follow_symlinks, f"{key}/" if key else "").run())
        elif root.is_file():
            entries.append(_file_entry(root, key or root.name, None))
        else:
            raise FileNotFoundError(f"no such file or folder: {printable(root)}")
    return Discovery(_one_file_per_key(entries))


def _one_file_per_key(entries: list[SourceFile | SkippedFile]) -> list[SourceFile | SkippedFile]:
    """The same file reached twice (``ingest a a/x``) is kept once; two files, one key: refused."""
    seen: dict[str, Path] = {}
    kept: list[SourceFile | SkippedFile] = []
    for entry in entries:
        if isinstance(entry, SourceFile):
            real = Path(os.path.realpath(entry.path))
            first = seen.get(entry.document_key)
            if first is None:
                seen[entry.document_key] = real
            elif first != real:
                raise KeyCollision(
                    f"{printable(first)} and {printable(real)} would both be document "
                    f"{entry.document_key!r}; ingest them separately or with --as"
                )
            else:
                continue  # the same file, named twice
        kept.append(entry)
    return kept


def _file_entry(path: Path, key: str, inside: Path | None) -> SourceFile | SkippedFile:
    if not _is_text(key):
        return _error(path, None, "file name is not valid UTF-8; rename it to ingest it")
    if len(key) > MAX_KEY_CHARS:
        return _error(path, None, f"document key longer than {MAX_KEY_CHARS} characters")
    return SourceFile(path, key, inside)


def _error(path: Path, key: str | None, reason: str) -> SkippedFile:
    return SkippedFile(printable(path), key if key and _is_text(key) else None, "error", reason)


def _skipped(path: Path, key: str, reason: str) -> SkippedFile:
    return SkippedFile(printable(path), key if _is_text(key) else None, "skipped", reason)


@attrs.frozen
class _Folder:
    path: Path  # as the user will see it (under the argument)
    key: str  # key prefix of its files: "" or "sub/"
    real: Path  # resolved, where it is read from


def _identity(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


@attrs.define
class _FolderWalk:
    """Walks one folder argument.

    Real sub-folders are walked first and links to folders only afterwards, so each folder is
    walked once, under its own name when it has one, and a link to a folder already walked (a
    loop, or a second name) is reported instead of walked again.
    """

    root: Path
    follow_symlinks: bool
    prefix: str = ""  # the root's key with a slash, or "": the start of every key under it
    real_root: Path = attrs.field(init=False)
    found: list[tuple[list[str], SourceFile | SkippedFile]] = attrs.Factory(list)
    walked: dict[tuple[int, int], str] = attrs.Factory(dict)  # folder identity → key shown
    folders: deque[_Folder] = attrs.Factory(deque)
    linked: deque[_Folder] = attrs.Factory(deque)

    def __attrs_post_init__(self) -> None:
        self.real_root = Path(os.path.realpath(self.root))

    def run(self) -> list[SourceFile | SkippedFile]:
        self.walked[_identity(self.real_root)] = ""
        self.folders.append(_Folder(self.root, self.prefix, self.real_root))
        while self.folders or self.linked:
            if self.folders:
                self._scan(self.folders.popleft())
            else:
                self._enter_link(self.linked.popleft())
        self.found.sort(key=lambda item: item[0])
        return [entry for _, entry in self.found]

    def _add(self, key: str, entry: SourceFile | SkippedFile) -> None:
        self.found.append((key.split("/"), entry))

    def _enter_link(self, link: _Folder) -> None:
        key = link.key.rstrip("/")
        try:
            identity = _identity(link.real)
        except OSError as exc:
            self._add(key, _error(link.path, key, f"cannot read folder: {exc.strerror}"))
            return
        if identity in self.walked:
            where = self.walked[identity]
            reason = (
                f"symbolic link to a folder already walked as {where!r}"
                if where
                else "symbolic link back to the folder being ingested, already walked (a loop)"
            )
            self._add(key, _skipped(link.path, key, reason))
            return
        self.walked[identity] = key
        self._scan(link)

    def _scan(self, folder: _Folder) -> None:
        try:
            with os.scandir(folder.real) as listing:
                children = sorted(listing, key=lambda entry: entry.name)
        except OSError as exc:
            key = folder.key.rstrip("/") or "."
            self._add(key, _error(folder.path, None, f"cannot read folder: {exc.strerror}"))
            return
        for child in children:
            if child.name.startswith("."):
                continue
            path, key = folder.path / child.name, folder.key + child.name
            try:
                self._child(child, path, key)
            except OSError as exc:  # vanished or unreadable while we looked
                self._add(key, _error(path, key, f"cannot read: {exc.strerror}"))

    def _child(self, child: os.DirEntry[str], path: Path, key: str) -> None:
        if child.is_symlink():
            self._link(Path(child.path), path, key)
        elif child.is_dir(follow_symlinks=False):
            self._subfolder(_Folder(path, key + "/", Path(child.path)))
        elif child.is_file(follow_symlinks=False):
            self._add(key, _file_entry(path, key, self._inside))
        else:
            self._add(key, _skipped(path, key, "not a regular file"))

    @property
    def _inside(self) -> Path | None:
        return None if self.follow_symlinks else self.real_root

    def _subfolder(self, folder: _Folder) -> None:
        if not _is_text(folder.key):
            reason = "folder name is not valid UTF-8; none of its files were ingested"
            self._add(folder.key.rstrip("/"), _error(folder.path, None, reason))
            return
        self.walked[_identity(folder.real)] = folder.key.rstrip("/")
        self.folders.append(folder)

    def _link(self, link: Path, path: Path, key: str) -> None:
        target = Path(os.path.realpath(link))
        try:
            st = os.stat(target)
        except OSError as exc:
            self._add(key, _error(path, key, f"broken symbolic link ({exc.strerror})"))
            return
        kind = "folder" if stat.S_ISDIR(st.st_mode) else "file"
        if not self.follow_symlinks and not target.is_relative_to(self.real_root):
            reason = (
                f"symbolic link to a {kind} outside the folder ({printable(target)}); "
                "use --follow-symlinks to ingest it"
            )
            self._add(key, _skipped(path, key, reason))
        elif stat.S_ISDIR(st.st_mode):
            if _is_text(key):
                self.linked.append(_Folder(path, key + "/", target))
            else:
                reason = "folder name is not valid UTF-8; none of its files were ingested"
                self._add(key, _error(path, None, reason))
        elif stat.S_ISREG(st.st_mode):
            self._add(key, _file_entry(path, key, self._inside))
        else:
            self._add(key, _skipped(path, key, "symbolic link to something not a regular file"))
