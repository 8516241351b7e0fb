"""Where the home is: found the way git finds its repository, else one folder per user.

From the working directory up to the file-system root, the first folder that holds a
``trioindex.toml`` or a ``.trioindex/`` folder is the *project*: its ``trioindex.toml`` is the
configuration file and its ``.trioindex/`` the home, from whichever of its sub-folders a command
runs. With no project, the home is the user's data folder, ``$XDG_DATA_HOME/trioindex`` or
``~/.local/share/trioindex``. The ``home`` key (``TRIOINDEX_HOME``) names another.

:func:`ensure_home` creates a missing home (mode 0700) and says whether it did, so that a
command can tell the user where their data now lives.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from trioindex.errors import ConfigError

CONFIG_FILENAME: Final = "trioindex.toml"
PROJECT_HOME: Final = ".trioindex"
#: The one line a command prints when it created the home (also the API's log line).
CREATED_HOME: Final = (
    "created the trioindex home {home} (database and stored files; "
    "`home` or TRIOINDEX_HOME chooses another)"
)


def find_project(start: Path) -> Path | None:
    """The nearest folder at or above ``start`` with a ``trioindex.toml`` or ``.trioindex/``."""
    for folder in (start, *start.parents):
        if (folder / CONFIG_FILENAME).is_file() or (folder / PROJECT_HOME).is_dir():
            return folder
    return None


def user_data_home(environ: Mapping[str, str]) -> Path:
    """``$XDG_DATA_HOME/trioindex`` when that is an absolute path, else
    ``~/.local/share/trioindex`` (the XDG rule: a relative value is ignored)."""
    data = environ.get("XDG_DATA_HOME", "")
    if data and os.path.isabs(data):
        return Path(data) / "trioindex"
    user = environ.get("HOME", "")
    base = Path(user) if user and os.path.isabs(user) else Path.home()
    return base / ".local" / "share" / "trioindex"


def default_home(start: Path, environ: Mapping[str, str]) -> Path:
    """The home when no setting names one: the project's ``.trioindex/``, else the user's."""
    project = find_project(start)
    return project / PROJECT_HOME if project is not None else user_data_home(environ)


def ensure_home(home: Path) -> bool:
    """Create ``home`` (0700, with any missing parents) when it does not exist; True if it
    was created here. A path that exists and is not a folder is left to the caller's error."""
    if home.exists():
        return False
    try:
        home.mkdir(mode=0o700, parents=True)
    except FileExistsError:  # another process made it first
        return False
    except OSError as exc:
        raise ConfigError(f"home: cannot create {home}: {exc.strerror}") from None
    return True
