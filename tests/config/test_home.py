"""Where the home and the configuration file are found: the project at or above the working
directory (a ``trioindex.toml`` or ``.trioindex/``), else the user's data folder."""

from __future__ import annotations

from pathlib import Path

from trioindex.config import load_settings


def test_a_project_home_is_found_from_any_sub_folder(tmp_path: Path) -> None:
    (tmp_path / ".trioindex").mkdir()
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    env = {"XDG_DATA_HOME": str(tmp_path / "data")}
    assert load_settings(environ=env, cwd=deep).home == tmp_path / ".trioindex"
    assert load_settings(environ=env, cwd=tmp_path).home == tmp_path / ".trioindex"


def test_the_project_file_is_read_from_a_sub_folder_and_its_relative_home_starts_there(
    tmp_path: Path,
) -> None:
    (tmp_path / "trioindex.toml").write_text('home = "data"\n[database]\npool-size = 3\n')
    sub = tmp_path / "sub"
    sub.mkdir()
    settings = load_settings(environ={}, cwd=sub)
    assert settings.home == tmp_path / "data"
    assert settings.database.pool_size == 3


def test_a_project_file_without_home_puts_the_home_beside_it(tmp_path: Path) -> None:
    (tmp_path / "trioindex.toml").write_text("[database]\npool-size = 3\n")
    sub = tmp_path / "sub"
    sub.mkdir()
    assert load_settings(environ={}, cwd=sub).home == tmp_path / ".trioindex"


def test_the_nearest_project_wins(tmp_path: Path) -> None:
    (tmp_path / ".trioindex").mkdir()
    inner = tmp_path / "inner"
    (inner / ".trioindex").mkdir(parents=True)
    assert load_settings(environ={}, cwd=inner).home == inner / ".trioindex"


def test_without_a_project_the_home_is_the_users_data_folder(tmp_path: Path) -> None:
    cwd = tmp_path / "anywhere"
    cwd.mkdir()
    xdg = {"XDG_DATA_HOME": str(tmp_path / "xdg")}
    assert load_settings(environ=xdg, cwd=cwd).home == tmp_path / "xdg" / "trioindex"
    # a relative XDG_DATA_HOME is ignored (the XDG rule), as is an empty one
    for value in ("relative/data", ""):
        home = {"XDG_DATA_HOME": value, "HOME": str(tmp_path / "me")}
        expected = tmp_path / "me" / ".local" / "share" / "trioindex"
        assert load_settings(environ=home, cwd=cwd).home == expected


def test_trioindex_home_still_wins_and_a_relative_one_starts_at_the_working_folder(
    tmp_path: Path,
) -> None:
    (tmp_path / ".trioindex").mkdir()
    (tmp_path / "trioindex.toml").write_text('home = "from-file"\n')
    sub = tmp_path / "sub"
    sub.mkdir()
    assert load_settings(environ={"TRIOINDEX_HOME": "/srv/ti"}, cwd=sub).home == Path("/srv/ti")
    assert load_settings(environ={"TRIOINDEX_HOME": "here"}, cwd=sub).home == sub / "here"
    # an empty variable unsets the key, also over the file: the default again
    assert load_settings(environ={"TRIOINDEX_HOME": " "}, cwd=sub).home == tmp_path / ".trioindex"
