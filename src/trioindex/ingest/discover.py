"""What a run covers: files named directly, and every visible file under the folders named.

Owns the document key rule (:func:`argument_key`: relative to the current directory, so
``ingest a/`` and ``ingest b/`` can never make one file a version of the other), the rules for
what is left out
(hidden names, names that are not UTF-8, anything not a regular file) and the symbolic link
rules: a link inside a folder is followed only when it stays inside that folder (unless
``follow_symlinks``), and every folder is walked at most once, so links cannot make the walk
loop. Every folder is read through a descriptor reached from the folder argument name by name,
never through a link (:mod:`.nofollow`), so a folder someone swaps for a link while it is
walked is never read. Anything wrong with one entry, or an entry that changes while it is
read, becomes a :class:`SkippedFile`, never an exception.
"""

from __future__ import annotations

import errno
import fnmatch
import functools
import os
import stat
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import attrs

from trioindex.errors import TrioindexError
from trioindex.ingest import nofollow
from trioindex.ingest.nofollow import Identity, identity
from trioindex.ingest.results import SkippedFile, printable

__all__ = [
    "MAX_KEY_CHARS",
    "Discovery",
    "Globs",
    "KeyCollision",
    "SourceFile",
    "argument_key",
    "check_arguments",
    "discover",
    "is_text",
    "keyed_by_itself",
]

MAX_KEY_CHARS: Final = 1024  # the CHECK on documents.external_key


def is_text(name: str) -> bool:
    """Whether ``name`` can be a key (PostgreSQL text)."""
    # Undecodable bytes in a file name arrive as lone surrogates (surrogateescape), which
    # PostgreSQL text cannot hold.
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@attrs.frozen
class SourceFile:
    """A file to ingest, as the walk found it.

    ``inside``: the resolved folder it is opened from, and ``below`` its names under that
    folder, each opened without following a link (:func:`nofollow.open_file`; ``below`` None:
    the resolved ``path`` relative to ``inside``). ``inside`` None: a file named directly,
    opened by ``path``. ``identity``: its ``(st_dev, st_ino)`` when the walk saw it; the file
    opened must be that one (None: not checked). ``folder``: the folder argument it was
    found under (None: named directly).
    """

    path: Path
    document_key: str
    inside: Path | None = None
    below: tuple[str, ...] | None = None
    identity: Identity | None = None
    folder: Path | None = None


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
    * a folder ingested before: the key root recorded for it then, from wherever it is
      ingested and by whatever name (``ingest_paths`` passes it to :func:`discover`);
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
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    roots: Mapping[Path, str] | None = None,
) -> Discovery:
    """Files named directly, and every regular file under folders (recursively, sorted by key).

    Keys follow :func:`argument_key` (``cwd``: default the working directory), except for a
    folder argument in ``roots``, whose files are keyed under the root given there (the one
    recorded for it, :mod:`trioindex.db.folders`). Hidden files
    and folders (``.git``, ``.DS_Store``) are left out. A symbolic link inside a folder is
    followed only when its target is inside that folder, unless ``follow_symlinks``; every
    folder is walked at most once, so links cannot make the walk loop; no folder is read through
    a link it did not resolve and check itself. Paths named directly are always followed. A
    missing argument raises ``FileNotFoundError``; two different files with one key (``--as``
    over several arguments, say) raise :class:`KeyCollision` before anything is read; anything
    wrong with one entry of a folder, or an entry that changes while the walk reads it, becomes
    a :class:`SkippedFile`. ``include`` / ``exclude`` choose files by glob (:class:`Globs`);
    the files they leave out are left out silently, as hidden ones are.
    """
    globs = Globs(tuple(include), tuple(exclude))
    entries: list[SourceFile | SkippedFile] = []
    for root in paths:
        st = _argument_stat(root)
        if roots is not None and root in roots and st is not None and stat.S_ISDIR(st.st_mode):
            key = roots[root]
        else:
            key = argument_key(root, cwd=cwd, key_as=key_as)
        if st is not None and stat.S_ISDIR(st.st_mode):
            prefix = f"{key}/" if key else ""
            walked = _FolderWalk(root, follow_symlinks, prefix).run()
            entries.extend(
                attrs.evolve(e, folder=root) if isinstance(e, SourceFile) else e
                for e in walked
                if globs.keeps(e, e.document_key, prefix)
            )
        elif st is not None and stat.S_ISREG(st.st_mode):
            entry = _file_entry(root, key or root.name, st, None, None)
            if globs.keeps(entry, root.name, ""):
                entries.append(entry)
        else:
            raise _missing(root)
    return Discovery(_one_file_per_key(entries))


@attrs.frozen
class Globs:
    """``--include`` / ``--exclude``: a file is kept when it matches some ``include`` pattern
    (or none is given) and no ``exclude`` pattern. A pattern with a ``/`` is matched against the
    file's path below the folder argument (``drafts/*``), one without against its name
    (``*.md``); ``*`` matches ``/`` too, and case counts."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def keeps(self, entry: SourceFile | SkippedFile, key: str | None, prefix: str) -> bool:
        if not isinstance(entry, SourceFile) or not (self.include or self.exclude):
            return True  # what the walk reports is reported whatever the patterns
        below = (key or "").removeprefix(prefix)
        matches = functools.partial(_matches, below, below.rsplit("/", 1)[-1])
        if self.include and not any(map(matches, self.include)):
            return False
        return not any(map(matches, self.exclude))


def _matches(below: str, name: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(below if "/" in pattern else name, pattern)


def check_arguments(paths: Sequence[Path]) -> None:
    """Raise for the first path that is neither a file nor a folder, as :func:`discover` would,
    before anything else is done (a command checks its arguments first)."""
    for root in paths:
        st = _argument_stat(root)
        if st is None or not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            raise _missing(root)


def _missing(root: Path) -> FileNotFoundError:
    return FileNotFoundError(f"no such file or folder: {printable(root)}")


def _argument_stat(root: Path) -> os.stat_result | None:
    """What a path named directly is, following links; None when there is nothing there."""
    try:
        return os.stat(root)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise


def _one_file_per_key(entries: list[SourceFile | SkippedFile]) -> list[SourceFile | SkippedFile]:
    """The same file reached twice (``ingest a a/x``) is kept once; two files, one key: refused."""
    seen: dict[str, SourceFile] = {}
    kept: list[SourceFile | SkippedFile] = []
    for entry in entries:
        if isinstance(entry, SourceFile):
            first = seen.setdefault(entry.document_key, entry)
            if first.identity != entry.identity:
                raise KeyCollision(
                    f"{printable(first.path)} and {printable(entry.path)} would both be "
                    f"document {entry.document_key!r}; ingest them separately or with --as"
                )
            if first is not entry:
                continue  # the same file, named twice
        kept.append(entry)
    return kept


def _file_entry(
    path: Path, key: str, st: os.stat_result, inside: Path | None, below: tuple[str, ...] | None
) -> SourceFile | SkippedFile:
    if not is_text(key):
        return _error(path, None, "file name is not valid UTF-8; rename it to ingest it")
    if len(key) > MAX_KEY_CHARS:
        return _error(path, None, f"document key longer than {MAX_KEY_CHARS} characters")
    return SourceFile(path, key, inside, below, identity(st))


def _error(path: Path, key: str | None, reason: str) -> SkippedFile:
    return SkippedFile(printable(path), key if key and is_text(key) else None, "error", reason)


def _skipped(path: Path, key: str, reason: str) -> SkippedFile:
    return SkippedFile(printable(path), key if is_text(key) else None, "skipped", reason)


@attrs.frozen
class _Folder:
    path: Path  # as the user will see it (under the argument)
    key: str  # key prefix of its files: "" or "sub/"
    start: Path  # resolved folder it is reached from (nofollow): the root, or a link's target
    parts: tuple[str, ...]  # its names below ``start``
    identity: Identity  # what the listing that found it saw; what is read must be that folder


@attrs.define
class _FolderWalk:
    """Walks one folder argument, each folder through a descriptor reached from the root name by
    name without following a link (:mod:`.nofollow`).

    Real sub-folders are walked first and links to folders only afterwards, so each folder is
    walked once, under its own name when it has one, and a link to a folder already walked (a
    loop, or a second name) is reported instead of walked again. An entry that changes while
    the walk reads it (gone, a link or a file now where a folder was, another folder in its
    place) is ``skipped`` with its key, and the walk goes on.
    """

    root: Path
    follow_symlinks: bool
    prefix: str = ""  # the root's key with a slash, or "": the start of every key under it
    real_root: Path = attrs.field(init=False)
    found: list[tuple[list[str], SourceFile | SkippedFile]] = attrs.Factory(list)
    walked: dict[Identity, str] = attrs.Factory(dict)  # folder identity → key shown
    folders: deque[_Folder] = attrs.Factory(deque)
    linked: deque[_Folder] = attrs.Factory(deque)

    def run(self) -> list[SourceFile | SkippedFile]:
        try:
            self.real_root = Path(os.path.realpath(self.root))
            root = identity(os.stat(self.real_root))
        except OSError as exc:
            return [_error(self.root, None, f"cannot read folder: {exc.strerror}")]
        self.walked[root] = ""
        self.folders.append(_Folder(self.root, self.prefix, self.real_root, (), root))
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
        if link.identity in self.walked:
            where = self.walked[link.identity]
            reason = (
                f"symbolic link to a folder already walked as {where!r}"
                if where
                else "symbolic link back to the folder being ingested, already walked (a loop)"
            )
            self._add(key, _skipped(link.path, key, reason))
            return
        self.walked[link.identity] = key
        self._scan(link)

    def _scan(self, folder: _Folder) -> None:
        key = folder.key.rstrip("/")
        try:
            with nofollow.folder(folder.start, folder.parts) as fd:
                if identity(os.fstat(fd)) != folder.identity:
                    self._add(key, _changed(folder.path, key, "another folder took its place"))
                    return
                with os.scandir(fd) as listing:
                    children = sorted(listing, key=lambda entry: entry.name)
                for child in children:  # while fd is open: the entries stat through it
                    if not child.name.startswith("."):
                        self._child(folder, child)
        except OSError as exc:
            change = nofollow.change(exc)
            self._add(
                key or ".",
                _changed(folder.path, key, change)
                if change
                else _error(folder.path, None, f"cannot read folder: {exc.strerror}"),
            )

    def _child(self, folder: _Folder, child: os.DirEntry[str]) -> None:
        path, key = folder.path / child.name, folder.key + child.name
        parts = (*folder.parts, child.name)
        try:
            st = child.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                self._link(folder.start.joinpath(*parts), path, key)
            elif stat.S_ISDIR(st.st_mode):
                self._subfolder(_Folder(path, key + "/", folder.start, parts, identity(st)))
            elif stat.S_ISREG(st.st_mode):
                self._add(key, _file_entry(path, key, st, folder.start, parts))
            else:
                self._add(key, _skipped(path, key, "not a regular file"))
        except OSError as exc:  # vanished or unreadable while we looked
            why = nofollow.change(exc)
            self._add(
                key,
                _changed(path, key, why)
                if why
                else _error(path, key, f"cannot read: {exc.strerror}"),
            )

    def _subfolder(self, folder: _Folder) -> None:
        if not is_text(folder.key):
            reason = "folder name is not valid UTF-8; none of its files were ingested"
            self._add(folder.key.rstrip("/"), _error(folder.path, None, reason))
            return
        self.walked[folder.identity] = folder.key.rstrip("/")
        self.folders.append(folder)

    def _reach(self, target: Path) -> tuple[Path, tuple[str, ...]]:
        """Where a link's resolved ``target`` is read from: below the root when it is inside,
        else (``follow_symlinks``) from the folder it is in."""
        if target.is_relative_to(self.real_root):
            return self.real_root, target.relative_to(self.real_root).parts
        return (target.parent, (target.name,)) if target.name else (target, ())

    def _link(self, link: Path, path: Path, key: str) -> None:
        try:
            target = Path(os.path.realpath(link))
        except OSError:  # it stopped being a link while it was resolved
            self._add(key, _changed(path, key, "the symbolic link changed"))
            return
        start, parts = self._reach(target)
        try:
            st = nofollow.lstat_below(start, parts)
        except OSError as exc:
            self._add(key, _error(path, key, f"broken symbolic link ({exc.strerror})"))
            return
        if stat.S_ISLNK(st.st_mode):  # a loop of links, or a link put on the way meanwhile
            if _resolves_to(link, target):
                reason = f"broken symbolic link ({os.strerror(errno.ELOOP)})"
                self._add(key, _error(path, key, reason))
            else:
                self._add(key, _changed(path, key, "a folder on the link's way changed"))
            return
        kind = "folder" if stat.S_ISDIR(st.st_mode) else "file"
        if not self.follow_symlinks and not target.is_relative_to(self.real_root):
            reason = (
                f"symbolic link to a {kind} outside the folder ({printable(target)}); "
                "use --follow-symlinks to ingest it"
            )
            self._add(key, _skipped(path, key, reason))
        elif stat.S_ISDIR(st.st_mode):
            if is_text(key):
                self.linked.append(_Folder(path, key + "/", start, parts, identity(st)))
            else:
                reason = "folder name is not valid UTF-8; none of its files were ingested"
                self._add(key, _error(path, None, reason))
        elif stat.S_ISREG(st.st_mode):
            self._add(key, _file_entry(path, key, st, start, parts))
        else:
            self._add(key, _skipped(path, key, "symbolic link to something not a regular file"))


def _resolves_to(link: Path, target: Path) -> bool:
    """Whether ``link`` still resolves to ``target`` (it always does, unless the way changed)."""
    try:
        return Path(os.path.realpath(link)) == target
    except OSError:
        return False


def _changed(path: Path, key: str, why: str) -> SkippedFile:
    reason = f"changed while the folder was read ({why}); not ingested"
    return _skipped(path, key, reason) if key else _error(path, None, reason)
