"""How long the commands of a user's first hour take: a fresh clone's first steps, ``just``
recipes and the CLI's own start-up.

*Fresh clone* (skipped with ``--no-clone``): the repository's committed HEAD is cloned into a
private folder (mode 0700, as ``/root`` or ``mktemp -d`` are), with the user's data folder
(``XDG_DATA_HOME``) in it too and no ``TRIOINDEX_*`` setting, and a new user's steps are timed
once each, from the clone: ``just setup`` (its own ``.venv``), ``just worker`` until it says it
is ready (the embedded PostgreSQL is created in the default home, the local model loaded),
``just cli ingest docs --wait`` (the repository's documentation, indexed by that worker),
``just cli status``, ``just cli search`` with the local model while the worker runs, and
``--help``. Nothing of it is left behind but the install cache in ``/var/cache/trioindex``.

Each command runs ``--runs`` times as a subprocess (as a person types it, from the repository
root, with a throwaway ``TRIOINDEX_HOME``); the table gives the median and the range of wall
time and the median CPU time of the child processes. ``status`` is measured twice: *cold*
(nothing else uses the embedded PostgreSQL, so the command starts it and the last user stops
it again) and *warm* (another process holds the server, as a running worker does). ``search``
is measured three ways: against the tests' fake TEI server (a server model: nothing from torch
is imported), and with the default local model while a ``trioindex worker`` of the same home
runs (the search borrows the worker's loaded model over its socket) and after it stopped (the
search loads the model itself), in a home of their own whose worker first indexes
``docs/design``. The local model's
import and load time is one more subprocess that loads it and says how long each part took.
Every command runs as in a user's shell, with Python's bytecode cache on (a
``PYTHONDONTWRITEBYTECODE`` of the calling environment is dropped). ``--baseline FILE.json``
adds the medians of an earlier run (e.g. before a change).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    REPO_ROOT,
    Session,
    add_out,
    bench_parser,
    machine_info,
    markdown_table,
    page_head,
    utc_now,
    write_json,
)
from bench.harness import PYTHON, start_worker, tei_settings, worker_env
from testkit.embed_process import EmbedServerProcess

CLI = str(REPO_ROOT / ".venv" / "bin" / "trioindex")

_LOAD_MODEL = """
import json, time
t0 = time.perf_counter()
from sentence_transformers import SentenceTransformer
from trioindex.embedding.local import DEFAULT_MODEL, packaged_model_path
t1 = time.perf_counter()
SentenceTransformer(str(packaged_model_path(DEFAULT_MODEL)), local_files_only=True)
print(json.dumps({"import_s": t1 - t0, "load_s": time.perf_counter() - t1}))
"""


def _user_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` as a user's shell has it: Python caches bytecode."""
    return {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _local_search(root: Path, runs: int) -> dict[str, dict[str, Any]]:
    """``search`` with the local model while a worker of a home of its own (under ``root``:
    the local model serves search there) runs, then without one."""
    env = _user_env(worker_env(HOME=str(root / "local-home")))
    search = [CLI, "search", "how do workers share a queue"]
    log = root / "worker.log"
    worker = start_worker([CLI, "worker"], env, log)
    try:
        ingest = [CLI, "ingest", str(REPO_ROOT / "docs" / "design"), "--wait"]
        subprocess.run(ingest, cwd=REPO_ROOT, env=env, capture_output=True, check=True)
        warm = _time_in(search, REPO_ROOT, env, runs)
    finally:
        worker.send_signal(signal.SIGINT)
        worker.wait(90)
    cold = _time_in(search, REPO_ROOT, env, min(runs, 3))
    if warm["exit"] or cold["exit"]:
        raise RuntimeError(f"search with the local model failed (see {log})")
    return {
        "trioindex search, local model (worker running)": warm,
        "trioindex search, local model (no worker)": cold,
    }


def measure(runs: int) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="trioindex-first-hour-") as tmp:
        Path(tmp).chmod(0o711)  # the embedded server's system user must reach the home in it
        env = _user_env(worker_env(HOME=str(Path(tmp) / "home")))
        commands = {
            "just setup (already set up)": ["just", "setup"],
            "just cli --help": ["just", "cli", "--help"],
            "trioindex --help": [CLI, "--help"],
            "trioindex --version": [CLI, "--version"],
            "trioindex status (cold: starts the embedded PostgreSQL)": [CLI, "status"],
        }
        _time_in([CLI, "migrate"], REPO_ROOT, env, 1)  # the first start creates the database
        for name, args in commands.items():
            results[name] = _time_in(args, REPO_ROOT, env, runs)
        # another process holds the embedded server, as a running worker does
        hold = "import sys; from pathlib import Path; from trioindex.db.pool import start_embedded"
        hold += "; start_embedded(Path(sys.argv[1])); print('up', flush=True); sys.stdin.read()"
        holder = subprocess.Popen(
            [PYTHON, "-c", hold, env["TRIOINDEX_HOME"]],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "up"
            warm = {
                "just cli status (warm)": ["just", "cli", "status"],
                "trioindex status (warm)": [CLI, "status"],
                "trioindex jobs list (warm)": [CLI, "jobs", "list"],
            }
            for name, args in warm.items():
                results[name] = _time_in(args, REPO_ROOT, env, runs)
            with EmbedServerProcess(latency_ms=1, dimension=1024) as server:
                tei = worker_env(HOME=env["TRIOINDEX_HOME"], **tei_settings(server, 1024))
                tei = _user_env(tei)
                search = [CLI, "search", "how do workers share a queue"]
                results["trioindex search, TEI model (warm)"] = _time_in(
                    search, REPO_ROOT, tei, runs
                )
            results.update(_local_search(Path(tmp), runs))
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(timeout=60)
    out = subprocess.run(
        [PYTHON, "-c", _LOAD_MODEL], env=env, capture_output=True, text=True, check=True
    )
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    results["local model: import sentence-transformers + torch"] = {
        "median_s": round(loaded["import_s"], 3)
    }
    results["local model: load all-MiniLM-L6-v2"] = {"median_s": round(loaded["load_s"], 3)}
    return results


def _once(args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> dict[str, Any]:
    """One timed run of ``args``; its exit code and the last lines of its output on failure."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    result: dict[str, Any] = {
        "median_s": round(wall, 3),
        "cpu_median_s": round(cpu, 3),
        "exit": done.returncode,
    }
    if done.returncode:
        result["said"] = (done.stdout + done.stderr).strip().splitlines()[-3:]
    return result


def fresh_clone(runs: int) -> dict[str, dict[str, Any]]:
    """A new user's first steps in a clone under a private folder (see the module docstring)."""
    results: dict[str, dict[str, Any]] = {}
    private = Path(tempfile.mkdtemp(prefix="trioindex-fresh-clone-"))  # 0700
    clone = private / "trioindex"
    branch = subprocess.run(
        ["git", "rev-parse", "--abbrev-ref", "HEAD"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    subprocess.run(
        ["git", "clone", "--quiet", "--branch", branch, str(REPO_ROOT), str(clone)], check=True
    )
    env = {k: v for k, v in _user_env(dict(os.environ)).items()
           if not k.startswith(("TRIOINDEX_", "VIRTUAL_ENV"))}  # fmt: skip
    env["XDG_DATA_HOME"] = str(private / "share")
    home = private / "share" / "trioindex"
    worker: subprocess.Popen[bytes] | None = None
    try:
        results["fresh clone: just setup (first time)"] = _once(["just", "setup"], clone, env, 1800)
        log = private / "worker.log"
        began = time.perf_counter()
        with log.open("wb") as out:
            worker = subprocess.Popen(
                ["just", "worker"], cwd=clone, env=env, stdout=out, stderr=out,
                start_new_session=True,
            )  # fmt: skip
        while "ready:" not in log.read_text(errors="replace"):
            if worker.poll() is not None or time.perf_counter() - began > 600:
                raise RuntimeError("just worker did not get ready:\n" + log.read_text()[-2000:])
            time.sleep(0.2)
        results["fresh clone: just worker, until ready"] = {
            "median_s": round(time.perf_counter() - began, 3)
        }
        docs = len([p for p in (clone / "docs").rglob("*") if p.is_file()])
        ingest = ["just", "cli", "ingest", "docs", "--wait"]
        results[f"fresh clone: just cli ingest docs --wait ({docs} files)"] = _once(
            ingest, clone, env, 1800
        )
        status = ["just", "cli", "status"]
        results["fresh clone: just cli status (worker running)"] = _time_in(
            status, clone, env, runs
        )
        search = ["just", "cli", "search", "how do workers share a queue"]
        results["fresh clone: just cli search, local model (worker running)"] = _time_in(
            search, clone, env, min(runs, 3)
        )
        trioindex = str(clone / ".venv" / "bin" / "trioindex")
        results["fresh clone: trioindex --help"] = _time_in([trioindex, "--help"], clone, env, runs)
    finally:
        if worker is not None and worker.poll() is None:
            os.killpg(worker.pid, signal.SIGINT)  # our own child's group: just and the worker
            try:
                worker.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
        data = (home / "pgdata").resolve()
        trioindex_bin = clone / ".venv" / "bin" / "trioindex"
        if trioindex_bin.exists():
            subprocess.run([str(trioindex_bin), "db", "stop"], cwd=clone, env=env, check=False,
                           capture_output=True)  # fmt: skip
        if data.is_dir() and not data.is_relative_to(private):
            shutil.rmtree(data, ignore_errors=True)  # as root: the data folder outside the home
        shutil.rmtree(private, ignore_errors=True)
    return results


def _time_in(args: list[str], cwd: Path, env: dict[str, str], runs: int) -> dict[str, Any]:
    walls, cpus, code = [], [], 0
    for _ in range(runs):
        one = _once(args, cwd, env, 300)
        walls.append(one["median_s"])
        cpus.append(one["cpu_median_s"])
        code = code or one["exit"]
    return {
        "median_s": round(statistics.median(walls), 3),
        "min_s": round(min(walls), 3),
        "max_s": round(max(walls), 3),
        "cpu_median_s": round(statistics.median(cpus), 3),
        "exit": code,
    }


def _row(name: str, r: dict[str, Any], before: dict[str, Any]) -> list[str]:
    was = before.get(name, {}).get("median_s")
    spread = f"{r['min_s']:.2f}–{r['max_s']:.2f}" if "min_s" in r else ""
    cpu = f"{r['cpu_median_s']:.2f}" if "cpu_median_s" in r else ""
    failed = " (exit {})".format(r["exit"]) if r.get("exit") else ""
    return [
        name,
        f"{r['median_s']:.2f}{failed}",
        spread,
        cpu,
        f"{was:.2f}" if was is not None else "",
    ]


def main() -> int:
    parser = bench_parser("first_hour", __doc__ or "", "2 runs per command instead of 5")
    parser.add_argument("--runs", type=int, default=None, help="runs per command (default 5)")
    parser.add_argument("--baseline", type=Path, default=None, help="an earlier first-hour.json")
    parser.add_argument("--no-clone", action="store_true", help="skip the fresh clone's steps")
    add_out(parser, "first-hour")
    args = parser.parse_args()
    session = Session.start("first-hour", args)
    runs = args.runs or (2 if args.quick else 5)
    results = {} if args.no_clone else fresh_clone(runs)
    results.update(measure(runs))
    before = json.loads(args.baseline.read_text())["results"] if args.baseline else {}
    machine = machine_info()
    date, elapsed = utc_now(), time.monotonic() - session.began
    write_json(session.out / "first-hour.json", {"date": date, "machine": machine,
                                                 "runs": runs, "results": results})  # fmt: skip
    head = ["command", "median s", "range s", "CPU s (median)", "before (median s)"]
    lines = page_head("First hour: command times", date, session.command, elapsed, machine,
                      about=__doc__ or "")  # fmt: skip
    lines += ["## Results", "", f"{runs} runs per command.", ""]
    lines += markdown_table(head, [_row(n, r, before) for n, r in results.items()], "lrrrr")
    (session.out / "first-hour.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-len(results) - 2 :]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
