"""A folder someone else writes to while it is ingested: nothing outside it is ever read.

The attacker can write inside the folder, and keeps exchanging a sub-folder with a symbolic link
to another folder (``renameat2(RENAME_EXCHANGE)``, one atomic step) while ``ingest`` runs; the
deterministic tests put that link, or another file, in place at the worst moment: between the
walk and the open, and between listing a folder and reading its sub-folder.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import hashlib
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import trioindex.ingest as ingest_package
from trioindex.db.models import ensure_model
from trioindex.db.pool import Database
from trioindex.ingest import (
    FileNotIngested,
    IngestEntry,
    SkippedFile,
    SourceFile,
    discover,
    ingest_paths,
    prepare_file_sync,
)
from trioindex.storage import AsyncObjectStore, FolderStore

SECRET = b"TOPSECRET payroll line"
FILES = 40  # files in the swapped folder: each open is one more chance to lose the race
INGESTS = 30
SWAPS_AT_MOST = 20_000_000  # the swapper's bound, should the test not stop it first

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2

# Exchanges argv[1] and argv[2] as fast as it can, in its own process (no shared GIL), until
# killed or after argv[3] swaps. argv[4]: "exchange" (renameat2, atomic) or "rename" (three
# renames through a third name, for kernels without RENAME_EXCHANGE).
_SWAPPER = """
import ctypes, os, sys
a, b, limit, mode = os.fsencode(sys.argv[1]), os.fsencode(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
libc = ctypes.CDLL(None, use_errno=True)
libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
hold = b + b".hold"
def swap():
    if mode == "exchange":
        if libc.renameat2(-100, a, -100, b, 2) != 0:
            raise OSError(ctypes.get_errno(), "renameat2")
    else:
        os.rename(a, hold); os.rename(b, a); os.rename(hold, b)
swap(); swap()
print("ready", flush=True)
for _ in range(limit):
    swap()
"""


def _exchange_supported(folder: Path) -> bool:
    """Whether this kernel and file system exchange two names atomically (else the swapper
    falls back to three renames, which leave a moment with no ``up/sub`` at all)."""
    first, second = folder / "probe-a", folder / "probe-b"
    first.mkdir()
    second.symlink_to(first)
    try:
        renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
        if renameat2 is None:
            return False
        renameat2.argtypes = [
            ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint
        ]  # fmt: skip
        a, b = os.fsencode(first), os.fsencode(second)
        if renameat2(_AT_FDCWD, a, _AT_FDCWD, b, _RENAME_EXCHANGE) == 0:
            return True
        if ctypes.get_errno() in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            return False
        raise OSError(ctypes.get_errno(), "renameat2")
    finally:
        for probe in (first, second):
            probe.unlink() if probe.is_symlink() else probe.rmdir()


@contextlib.contextmanager
def _swapping(a: Path, b: Path) -> Iterator[str]:
    """A separate process exchanging ``a`` and ``b`` for as long as the block runs."""
    mode = "exchange" if _exchange_supported(a.parent) else "rename"
    swapper = subprocess.Popen(
        [sys.executable, "-c", _SWAPPER, str(a), str(b), str(SWAPS_AT_MOST), mode],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert swapper.stdout is not None and swapper.stdout.readline() == "ready\n"
        yield mode
    finally:
        swapper.kill()
        swapper.wait()
    hold = b.with_name(b.name + ".hold")
    if hold.exists() or hold.is_symlink():  # killed between two renames
        os.rename(hold, a if not (a.exists() or a.is_symlink()) else b)


def _secret_tree(tmp_path: Path) -> tuple[Path, Path]:
    """docs/up/sub: public files; outside/: files of the same names holding the secret; and
    docs/up/swap: a link to outside/, the name the swapper exchanges with docs/up/sub."""
    docs, outside = tmp_path / "docs", tmp_path / "outside"
    (docs / "up" / "sub").mkdir(parents=True)
    outside.mkdir()
    (docs / "top.txt").write_text("a file nobody touches")
    for i in range(FILES):
        (docs / "up" / "sub" / f"f{i:02d}.txt").write_text(f"public line {i}\n")
        (outside / f"f{i:02d}.txt").write_bytes(SECRET + f" {i}\n".encode())
    (outside / "only-outside.txt").write_bytes(SECRET + b" only outside\n")
    (docs / "up" / "swap").symlink_to(outside, target_is_directory=True)
    return docs, outside


def _secret_shas(outside: Path) -> set[str]:
    return {hashlib.sha256(f.read_bytes()).hexdigest() for f in outside.rglob("*") if f.is_file()}


def _assert_no_secret_stored(db: Database, blobs: Path, outside: Path) -> None:
    for blob in blobs.rglob("*"):
        assert not (blob.is_file() and SECRET in blob.read_bytes()), blob
    with db.connection() as conn:
        stored = {r["sha256"] for r in conn.execute("SELECT sha256 FROM document_versions")}
    assert not stored & _secret_shas(outside)


def _one_line_each(entries: list[IngestEntry]) -> None:
    for entry in entries:
        if isinstance(entry, SkippedFile):
            assert entry.reason and "\n" not in entry.reason, entry
            assert SECRET.decode() not in entry.reason


@pytest.mark.slow
async def test_a_folder_swapped_with_a_link_outside_while_ingesting_never_leaks_it(
    db: Database, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    docs, outside = _secret_tree(tmp_path)
    blobs = FolderStore(tmp_path / "blobs")
    blobs.ensure_ready()
    store = AsyncObjectStore(blobs, trio.CapacityLimiter(4))
    model = await db.run(ensure_model, "m", 4)
    aborted: list[str] = []
    outcomes: dict[str, int] = {}
    caplog.set_level(logging.INFO)
    with _swapping(docs / "up" / "sub", docs / "up" / "swap") as mode:
        for _ in range(INGESTS):
            try:
                with trio.fail_after(60):
                    entries = await ingest_paths(
                        [docs], db=db, store=store, model_id=model.id, max_attempts=3
                    )
            except Exception as exc:  # what the old code did: the whole run ends
                aborted.append(repr(exc))
                continue
            _one_line_each(entries)
            for entry in entries:
                outcomes[entry.status] = outcomes.get(entry.status, 0) + 1
            (top,) = [e for e in entries if e.document_key == "top.txt"]
            assert top.status in ("created", "unchanged")
    assert aborted == [], mode
    _assert_no_secret_stored(db, tmp_path / "blobs", outside)
    assert outcomes.get("created", 0) > FILES  # the public files were ingested meanwhile
    assert not [r for r in caplog.records if r.exc_info], "no traceback is logged"


# --- deterministic: the link arrives at the worst moment -----------------------------------------


def _replace_with_link(component: Path, target: Path) -> None:
    """Put a symbolic link to ``target`` where ``component`` is (atomically, by rename)."""
    link = component.with_name(component.name + ".link")
    link.symlink_to(target)
    moved = component.with_name(component.name + ".moved")
    os.rename(component, moved)
    os.rename(link, component)


def _mirror(tmp_path: Path) -> tuple[Path, Path]:
    """docs/up/sub/f1.txt (public) and outside/up/sub/f1.txt (the secret), the same layout."""
    docs, outside = tmp_path / "docs", tmp_path / "outside"
    for root, text in ((docs, b"public line 1\n"), (outside, SECRET + b" 1\n")):
        (root / "up" / "sub").mkdir(parents=True)
        (root / "up" / "sub" / "f1.txt").write_bytes(text)
    (docs / "a.txt").write_text("a neighbour")
    return docs, outside


@contextlib.contextmanager
def _before_next_open(monkeypatch: pytest.MonkeyPatch, act: Callable[[], None]) -> Iterator[None]:
    """Run ``act`` once, just before the next ``os.open`` of the block: whatever was checked
    before opening, it has changed by the time the file is opened."""
    real_open = os.open
    done: list[bool] = []

    def hooked(*args: Any, **kwargs: Any) -> int:
        if not done:
            act()
            done.append(True)
        return real_open(*args, **kwargs)

    monkeypatch.setattr(os, "open", hooked)
    yield
    monkeypatch.setattr(os, "open", real_open)
    assert done, "the file was never opened"


@pytest.mark.parametrize("component", ["up", "up/sub", "up/sub/f1.txt"])
def test_a_link_put_at_any_component_just_before_the_open_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, component: str
) -> None:
    docs, outside = _mirror(tmp_path)
    (source,) = [f for f in discover([docs]).files if f.document_key == "up/sub/f1.txt"]
    store = FolderStore(tmp_path / "blobs")
    store.ensure_ready()
    swap = functools.partial(_replace_with_link, docs / component, outside / component)
    with _before_next_open(monkeypatch, swap), pytest.raises(FileNotIngested) as refused:
        prepare_file_sync(source, store, latest=None)
    assert "\n" not in refused.value.reason
    for blob in (tmp_path / "blobs").rglob("*"):
        assert not (blob.is_file() and SECRET in blob.read_bytes())


def _walk_then(monkeypatch: pytest.MonkeyPatch, act: Callable[[], None]) -> None:
    """``ingest_paths`` walks the folder, then ``act`` changes it, then the files are opened."""
    real_discover = ingest_package.discover

    def walk_then_act(*args: Any, **kwargs: Any) -> Any:
        found = real_discover(*args, **kwargs)
        act()
        return found

    monkeypatch.setattr(ingest_package, "discover", walk_then_act)


async def _ingest(db: Database, tmp_path: Path, docs: Path) -> list[IngestEntry]:
    store = FolderStore(tmp_path / "blobs")
    store.ensure_ready()
    model = await db.run(ensure_model, "m", 4)
    with trio.fail_after(30):
        entries = await ingest_paths(
            [docs],
            db=db,
            store=AsyncObjectStore(store, trio.CapacityLimiter(4)),
            model_id=model.id,
            max_attempts=3,
        )
    _one_line_each(entries)
    return entries


def _outcomes(entries: list[IngestEntry]) -> list[tuple[str | None, str]]:
    return [(e.document_key, e.status) for e in entries]


@pytest.mark.parametrize("component", ["up", "up/sub", "up/sub/f1.txt"])
@pytest.mark.parametrize("leads", ["inside", "outside"])
async def test_a_link_put_at_any_component_after_the_walk_fails_that_file_alone(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, component: str, leads: str
) -> None:
    """Inside or outside the folder, what the link leads to is not the file the walk found."""
    docs, outside = _mirror(tmp_path)
    (docs / "other" / "up" / "sub").mkdir(parents=True)
    (docs / "other" / "up" / "sub" / "f1.txt").write_text("another file, inside")
    target = (docs / "other" if leads == "inside" else outside) / component
    _walk_then(monkeypatch, functools.partial(_replace_with_link, docs / component, target))
    entries = await _ingest(db, tmp_path, docs)
    assert _outcomes(entries) == [
        ("a.txt", "created"),
        ("other/up/sub/f1.txt", "created"),
        ("up/sub/f1.txt", "error"),
    ]
    _assert_no_secret_stored(db, tmp_path / "blobs", outside)


async def test_a_file_replaced_by_another_after_the_walk_fails_that_file_alone(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs, _ = _mirror(tmp_path)
    victim = docs / "up" / "sub" / "f1.txt"
    replacement = docs / "up" / "sub" / "new.tmp"

    def replace() -> None:
        replacement.write_text("not the file the walk found")
        os.rename(replacement, victim)

    _walk_then(monkeypatch, replace)
    entries = await _ingest(db, tmp_path, docs)
    assert _outcomes(entries) == [("a.txt", "created"), ("up/sub/f1.txt", "error")]
    refused = entries[1]
    assert isinstance(refused, SkippedFile) and "walk" in refused.reason


@contextlib.contextmanager
def _after_listing(
    monkeypatch: pytest.MonkeyPatch, folder: Path, act: Callable[[], None]
) -> Iterator[None]:
    """Run ``act`` once, right after the walk has listed ``folder`` (and looked at each entry):
    the sub-folders it saw have changed by the time it reads them."""
    real_scandir = os.scandir
    done: list[bool] = []

    def hooked(path: Any = ".") -> Any:
        where = os.readlink(f"/proc/self/fd/{path}") if isinstance(path, int) else os.fspath(path)
        listing = list(real_scandir(path))
        if not done and os.path.realpath(where) == os.path.realpath(folder):
            for entry in listing:
                entry.stat(follow_symlinks=False)  # what the walk learns of each entry, cached
                entry.is_dir()
            done.append(True)
            act()
        return contextlib.nullcontext(listing)

    monkeypatch.setattr(os, "scandir", hooked)
    yield
    monkeypatch.setattr(os, "scandir", real_scandir)
    assert done, "the folder was never listed"


def test_a_folder_replaced_by_a_link_outside_while_walking_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs, outside = _mirror(tmp_path)
    (outside / "up" / "sub" / "only-outside.txt").write_bytes(SECRET)
    swap = functools.partial(_replace_with_link, docs / "up" / "sub", outside / "up" / "sub")
    with _after_listing(monkeypatch, docs / "up", swap):
        found = discover([docs])
    assert [f.document_key for f in found.files] == ["a.txt"]
    (skipped,) = found.skipped
    assert (skipped.document_key, skipped.status) == ("up/sub", "skipped")
    assert "\n" not in skipped.reason


def test_a_folder_gone_while_walking_is_skipped_and_the_walk_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs, _ = _mirror(tmp_path)
    (docs / "up" / "z.txt").write_text("after the gone folder")
    gone = functools.partial(os.rename, docs / "up" / "sub", tmp_path / "sub-moved-away")
    with _after_listing(monkeypatch, docs / "up", gone):
        found = discover([docs])
    assert [f.document_key for f in found.files] == ["a.txt", "up/z.txt"]
    (skipped,) = found.skipped
    assert (skipped.document_key, skipped.status) == ("up/sub", "skipped")


def test_a_source_file_built_by_hand_still_opens_and_refuses_a_link_outside(
    tmp_path: Path,
) -> None:
    """``SourceFile(path, key, inside)`` (the shape before descriptors) keeps working."""
    docs, outside = _mirror(tmp_path)
    store = FolderStore(tmp_path / "blobs")
    store.ensure_ready()
    source = SourceFile(docs / "up" / "sub" / "f1.txt", "k", Path(os.path.realpath(docs)))
    assert prepare_file_sync(source, store, latest=None).version.byte_size == 14
    _replace_with_link(docs / "up", outside / "up")
    with pytest.raises(FileNotIngested):
        prepare_file_sync(source, store, latest=None)
