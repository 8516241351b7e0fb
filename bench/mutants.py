"""A mutation pass over the fencing, locking, retry, hand-back, drain and shutdown code.

``just mutants`` (``python -m bench.mutants``). Owns the runner that tries each mutant of the
curated catalogue — data, in ``bench/mutants.toml`` next to this file — against the tests that
should kill it.

A mutant is one text replacement in one file of ``src/trioindex`` — a module, or
``db/migrations/functions.sql``, the one text of every SQL function and trigger (the versioned
migrations hold only tables and data, so no mutant points at them). It is applied to a copy of
the package in a temporary folder, never to the working tree (other people run tests against
it at the same time), and the mutant's test files run with ``PYTHONPATH`` pointing at the copy:
that wins over the editable install, and the database fixtures migrate their template database
with the migrations and ``functions.sql`` of whichever ``trioindex`` is imported, so SQL
mutants take effect. ``pytest -x`` failing means the mutant was *killed*;
passing means it *survived*; a run past ``--timeout`` is killed too (the tests noticed a hang).
A mutant listed with a reason as *equivalent* cannot change any observable behaviour; it is
run all the same (unless ``--skip-equivalent``), so a wrong claim of equivalence shows up as
"killed".

Why a curated list rather than mutmut or cosmic-ray: most of the code under test is SQL held
in strings and migrations, where those tools can only replace a whole string (every test dies
at once and nothing is learnt), while the mutants that matter remove one condition, one
``FOR UPDATE`` or one ``SKIP LOCKED``. The Python mutants are chosen the same way: each
removes one guard of the shutdown, renewal, hand-back and drain paths. Every entry must match
its file exactly once (``--check``, also run by ``tests/test_mutants.py``), so the catalogue
fails loudly when the code it mutates changes.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import attrs

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGE = REPO_ROOT / "src" / "trioindex"
RESULT_PAGE = REPO_ROOT / "docs" / "test-results" / "mutation.md"

CATALOGUE_FILE = Path(__file__).with_name("mutants.toml")
QUICK_TIMEOUT = 60.0  # seconds for a ``quick`` first pass (the fake-clock tests take about one)


@attrs.frozen
class Mutant:
    """Replace ``old`` (which must occur exactly once) by ``new`` in ``path`` (relative to the
    package), then run ``tests`` (after a focused ``first_pass``, if any)."""

    name: str
    area: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    first_pass: tuple[str, ...] | None  # pytest arguments of the focused pass, if any
    equivalent: str | None = None
    quick: bool = False  # the first pass is a ``quick`` set, given at most QUICK_TIMEOUT


def load_catalogue(path: Path = CATALOGUE_FILE) -> tuple[Mutant, ...]:
    """The mutants of a catalogue file (``mutants.toml`` unless told), each with its focused
    first pass (see that file)."""
    data = tomllib.loads(path.read_text())
    focus, quick = data.get("focus", {}), data.get("quick", {})
    mutants = []
    for entry in data["mutant"]:
        tests = tuple(data["tests"][entry.get("tests", "lifecycle")])
        prefix = entry["name"].split(":", maxsplit=1)[0]
        equivalent = entry.get("equivalent")
        # equivalent mutants go straight to the full run: a focused pass could only survive too
        first_pass: tuple[str, ...] | None = None
        if equivalent is None and prefix in focus:
            first_pass = (*tests, "-k", focus[prefix])
        elif equivalent is None and prefix in quick:
            first_pass = tuple(quick[prefix])
        mutants.append(
            Mutant(
                entry["name"],
                entry["area"],
                entry["file"],
                entry["old"],
                entry["new"],
                tests,
                first_pass,
                equivalent,
                quick=equivalent is None and prefix not in focus and first_pass is not None,
            )
        )
    return tuple(mutants)


CATALOGUE = load_catalogue()


# ---------------------------------------------------------------------------------------------
# applying


def mutated_source(mutant: Mutant, root: Path = PACKAGE) -> str:
    """The mutated text of the mutant's file; raises if ``old`` does not occur exactly once."""
    text = (root / mutant.path).read_text()
    found = text.count(mutant.old)
    if found != 1:
        raise ValueError(f"{mutant.name!r}: expected one match in {mutant.path}, found {found}")
    return text.replace(mutant.old, mutant.new)


def check_catalogue(catalogue: Sequence[Mutant] = CATALOGUE) -> list[str]:
    """Problems with a catalogue: a pattern that no longer matches once, a duplicate name."""
    problems = []
    names = [m.name for m in catalogue]
    problems += [f"duplicate name {n!r}" for n in sorted({n for n in names if names.count(n) > 1})]
    for mutant in catalogue:
        try:
            mutated_source(mutant)
        except ValueError as exc:
            problems.append(str(exc))
    return problems


def _copy_package(into: Path, source: Path = PACKAGE) -> Path:
    target = into / "trioindex"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


# ---------------------------------------------------------------------------------------------
# running


@attrs.frozen
class Outcome:
    mutant: Mutant
    result: str  # killed | survived | timeout | error
    killed_by: str
    seconds: float


_FAILED_LINE = re.compile(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", re.MULTILINE)


def run_tests(
    package_parent: Path, tests: Sequence[str], timeout: float
) -> tuple[int | None, str, float]:
    """Run pytest on ``tests`` against the package under ``package_parent``; (exit code or None
    on timeout, output, seconds)."""
    env = {**os.environ, "PYTHONPATH": str(package_parent), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    started = time.monotonic()
    with subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            output, _ = proc.communicate(timeout=timeout)
            return proc.returncode, output, time.monotonic() - started
        except subprocess.TimeoutExpired:
            # SIGINT first: pytest then runs its fixture teardown, which stops the embedded
            # PostgreSQL it started; SIGKILL the whole group only if that does not end it
            os.killpg(proc.pid, signal.SIGINT)
            try:
                output, _ = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                output, _ = proc.communicate()
            return None, output, time.monotonic() - started


def _imports_from(package_parent: Path) -> bool:
    probe = subprocess.run(
        [sys.executable, "-c", "import trioindex; print(trioindex.__file__)"],
        env={**os.environ, "PYTHONPATH": str(package_parent)},
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
    )
    return Path(probe.stdout.strip()).is_relative_to(package_parent)


def try_mutant(mutant: Mutant, timeout: float, source: Path = PACKAGE) -> Outcome:
    """Killed by the focused pass, else by the full run, else survived. ``source`` is the
    package the mutant is applied to (the run's snapshot of ``src/trioindex``)."""
    passes: list[tuple[tuple[str, ...], float]] = []
    if mutant.first_pass is not None:
        limit = min(timeout, QUICK_TIMEOUT) if mutant.quick else timeout
        passes.append((mutant.first_pass, limit))
    passes.append((mutant.tests, timeout))
    spent = 0.0
    with tempfile.TemporaryDirectory(prefix="trioindex-mutant-") as folder:
        parent = Path(folder)
        package = _copy_package(parent, source)
        (package / mutant.path).write_text(mutated_source(mutant, source))
        for number, (arguments, limit) in enumerate(passes, 1):
            code, output, seconds = run_tests(parent, arguments, limit)
            spent += seconds
            if code == 0 or (code == 5 and number < len(passes)):  # 5: none selected
                continue
            if code is None:
                return Outcome(mutant, "timeout", f"(hung: no result within {limit:.0f}s)", spent)
            failed = _FAILED_LINE.search(output)
            if code == 1 and failed:
                return Outcome(mutant, "killed", failed.group(1), spent)
            tail = output.strip().splitlines()[-1:] or ["(no output)"]
            return Outcome(mutant, "error", f"pytest exit {code}: {tail[0][:120]}", spent)
    return Outcome(mutant, "survived", "", spent)


def baseline(timeout: float, mutants: Sequence[Mutant], source: Path = PACKAGE) -> None:
    """The unmutated copy must pass every test file the mutants use, or nothing is learnt."""
    files = sorted({t for m in mutants for t in m.tests})
    with tempfile.TemporaryDirectory(prefix="trioindex-mutant-") as folder:
        parent = Path(folder)
        _copy_package(parent, source)
        if not _imports_from(parent):
            raise SystemExit("PYTHONPATH does not win over the installed trioindex; stopping")
        code, output, seconds = run_tests(parent, files, timeout)
    if code != 0:
        print(output[-3000:])
        raise SystemExit(f"the unmutated code fails its own tests (exit {code}); stopping")
    print(f"baseline: {' '.join(files)} pass on the unmutated copy ({seconds:.0f}s)")


# ---------------------------------------------------------------------------------------------
# report


def _verdict(outcome: Outcome) -> str:
    equivalent = outcome.mutant.equivalent
    if outcome.result in ("killed", "timeout"):
        verdict = "killed" if outcome.result == "killed" else "killed (timeout)"
        return f"**{verdict} — but listed as equivalent: wrong claim**" if equivalent else verdict
    if outcome.result == "survived":
        return "equivalent" if equivalent else "**survived**"
    return f"**error** {outcome.killed_by}"


HOW_TO_READ = (
    "*killed*: a test failed (the first one is named). *killed (timeout)*: the tests hung; "
    "the runtime's fake-clock tests, which take about a second, are given "
    f"{QUICK_TIMEOUT:.0f} s. *equivalent*: survived, and cannot change behaviour (reasons "
    "below); a mutant listed as equivalent that is killed would be flagged. The last column "
    "is the seconds to the verdict, focused and full passes together, with two mutants run at "
    "once and other work sharing the machine (the load average above).",
)


def render(outcomes: Sequence[Outcome], *, command: str, machine: list[str], took: float) -> str:
    counts = {
        key: sum(1 for o in outcomes if _verdict(o).startswith(key))
        for key in ("killed", "equivalent", "**survived**", "**error**")
    }
    lines = [
        "# Mutation pass",
        "",
        "Generated by `bench/mutants.py` (see its docstring for how mutants are applied and why "
        "the list is curated). Each mutant is one text change to a copy of `src/trioindex`; its "
        "test files run against the copy with `pytest -x`.",
        "",
        f"Command: `{command}`  ",
        f"Date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}  ",
        f"Wall time: {took / 60:.1f} min",
        "",
        *[f"* {line}" for line in machine],
        "",
        f"**{len(outcomes)} mutants: {counts['killed']} killed, {counts['equivalent']} "
        f"equivalent, {counts['**survived**']} survived, {counts['**error**']} errors.**",
        "",
        *HOW_TO_READ,
        "",
        "| # | area | mutant | file | verdict | first failing test | s |",
        "|---|---|---|---|---|---|---|",
    ]
    for number, outcome in enumerate(outcomes, 1):
        mutant = outcome.mutant
        test = outcome.killed_by.replace("|", "\\|")
        lines.append(
            f"| {number} | {mutant.area} | {mutant.name} | `{mutant.path}` | "
            f"{_verdict(outcome)} | {f'`{test}`' if outcome.result == 'killed' else test} | "
            f"{outcome.seconds:.0f} |"
        )
    equivalents = [o.mutant for o in outcomes if o.mutant.equivalent]
    if equivalents:
        lines += ["", "## Why the equivalent mutants are equivalent", ""]
        lines += [f"* **{m.name}**: {m.equivalent}." for m in equivalents]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# command line


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.mutants", description=__doc__)
    parser.add_argument(
        "--catalogue",
        type=Path,
        default=CATALOGUE_FILE,
        help="the catalogue file (bench/holes.toml: the interleaving test's reverted fixes)",
    )
    parser.add_argument("--check", action="store_true", help="only check the catalogue applies")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    parser.add_argument("--only", action="append", default=[], help="mutants whose name has this")
    parser.add_argument("--skip-equivalent", action="store_true")
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at once")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per mutant")
    parser.add_argument("--output", type=Path, default=RESULT_PAGE)
    parser.add_argument("--no-write", action="store_true", help="print the page, do not write it")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    catalogue = load_catalogue(args.catalogue)
    problems = check_catalogue(catalogue)
    if problems:
        print("\n".join(problems))
        return 2
    selected = [
        m
        for m in catalogue
        if (not args.only or any(part in m.name for part in args.only))
        and not (args.skip_equivalent and m.equivalent)
    ]
    if args.check or args.list:
        for mutant in selected if args.list else []:
            print(f"{mutant.area:13} {mutant.name}{'  (equivalent)' if mutant.equivalent else ''}")
        print(f"{len(catalogue)} mutants, each matching its file once")
        return 0
    from bench.common import format_machine, machine_info  # numpy/psutil: only for a run

    started = time.monotonic()
    outcomes: list[Outcome] = []
    # One snapshot of the package for the whole run: the baseline and every mutant see the same
    # code even when the working tree changes meanwhile (a run takes an hour on a busy machine).
    with tempfile.TemporaryDirectory(prefix="trioindex-mutants-source-") as snapshot:
        source = _copy_package(Path(snapshot))
        for mutant in selected:
            mutated_source(mutant, source)  # checked above; fails now if the tree just changed
        baseline(args.timeout * 2, selected, source)
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            for outcome in pool.map(lambda m: try_mutant(m, args.timeout, source), selected):
                print(
                    f"{_verdict(outcome):12} {outcome.seconds:5.0f}s  {outcome.mutant.name}"
                    f"  {outcome.killed_by}",
                    flush=True,
                )
                outcomes.append(outcome)
    took = time.monotonic() - started
    command = "just mutants" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    page = render(outcomes, command=command, machine=format_machine(machine_info()), took=took)
    if args.no_write:
        print(page)
    else:
        args.output.write_text(page)
        print(f"wrote {args.output}")
    bad = [o for o in outcomes if _verdict(o).startswith("**")]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
