"""``trioindex search`` with the default local model, this tree against a baseline tree, in one
run: while a ``trioindex worker`` of the same home lends its loaded model (the warm path), and
after it stopped (the search loads the model itself).

The baseline is another checkout (``--baseline-tree``, e.g. ``git worktree add --detach
/tmp/base main``) run with this tree's ``.venv`` (its ``src`` first on ``PYTHONPATH``), so
both trees share one interpreter, one home, one database and one worker; the two trees' runs
alternate, so a change in the machine's load touches both alike. The home's worker first
indexes three of the repository's documents. Each figure is the median wall time of the
search subprocess and its median CPU time (user + system of the child), plus, per tree, the
CPU time of importing the modules a search loads (``python -c``). The 1-minute load average is
printed at the start and the end.
"""

from __future__ import annotations

import json
import os
import resource
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
    utc_now,
    write_json,
)
from bench.harness import PYTHON, start_worker, worker_env

QUERY = "how do workers share a queue"
DOCUMENTS = ("README.md", "docs/design/architecture.md", "docs/design/state-machine.md")
_IMPORTS = (
    "import time; t = time.process_time(); import trioindex.cli.documents, trioindex.api.index, "
    "trioindex.services, trioindex.search, trioindex.embedding.warm; "
    "print(time.process_time() - t)"
)


def _env(home: Path, tree: Path | None) -> dict[str, str]:
    env = {k: v for k, v in worker_env(HOME=str(home)).items() if k != "PYTHONDONTWRITEBYTECODE"}
    if tree is not None:
        env["PYTHONPATH"] = str(tree / "src")
    return env


def _search_once(env: dict[str, str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(
        [PYTHON, "-m", "trioindex.cli", "search", QUERY],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise RuntimeError(f"search failed: {done.stderr[-1500:]}")
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def _alternate(envs: dict[str, dict[str, str]], runs: int) -> dict[str, dict[str, float]]:
    walls: dict[str, list[float]] = {name: [] for name in envs}
    cpus: dict[str, list[float]] = {name: [] for name in envs}
    for _ in range(runs):
        for name, env in envs.items():
            wall, cpu = _search_once(env)
            walls[name].append(wall)
            cpus[name].append(cpu)
    return {
        name: {
            "median_s": round(statistics.median(walls[name]), 3),
            "min_s": round(min(walls[name]), 3),
            "max_s": round(max(walls[name]), 3),
            "cpu_median_s": round(statistics.median(cpus[name]), 3),
        }
        for name in envs
    }


def _import_cpu(env: dict[str, str], runs: int) -> float:
    times = []
    for _ in range(runs):
        done = subprocess.run(
            [PYTHON, "-c", _IMPORTS], env=env, capture_output=True, text=True, check=True
        )
        times.append(float(done.stdout))
    return round(statistics.median(times), 3)


def measure(baseline: Path, runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="trioindex-warm-search-") as tmp:
        Path(tmp).chmod(0o711)  # the embedded server's system user must reach the home in it
        home = Path(tmp) / "home"
        envs = {"this tree": _env(home, None), "baseline": _env(home, baseline)}
        results: dict[str, Any] = {
            "imports_cpu_s": {name: _import_cpu(env, runs) for name, env in envs.items()}
        }
        log = Path(tmp) / "worker.log"
        worker = start_worker([PYTHON, "-m", "trioindex.cli", "worker"], envs["this tree"], log)
        try:
            subprocess.run(
                [PYTHON, "-m", "trioindex.cli", "ingest", *DOCUMENTS, "--wait"],
                cwd=REPO_ROOT, env=envs["this tree"], capture_output=True, check=True,
            )  # fmt: skip
            results["worker running"] = _alternate(envs, runs)
        finally:
            worker.send_signal(signal.SIGINT)
            worker.wait(90)
        results["no worker"] = _alternate(envs, max(1, min(runs, 2)))
    return results


def main() -> int:
    parser = bench_parser(
        "warm_search", __doc__ or "", "3 runs per tree on the warm path instead of 9"
    )
    parser.add_argument("--baseline-tree", type=Path, required=True, help="a baseline checkout")
    parser.add_argument("--runs", type=int, default=None, help="runs per tree (default 9)")
    add_out(parser, "warm-search")
    args = parser.parse_args()
    session = Session.start("warm-search", args)
    runs = args.runs or (3 if args.quick else 9)
    load_before = os.getloadavg()[0]
    results = measure(args.baseline_tree.resolve(), runs)
    payload = {
        "date": utc_now(),
        "machine": machine_info(),
        "runs": runs,
        "load_average_1min": {"start": load_before, "end": os.getloadavg()[0]},
        "results": results,
    }
    write_json(session.out / "warm-search.json", payload)
    print(json.dumps(payload, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
