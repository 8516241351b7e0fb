"""The fake embedding server (:mod:`testkit.embed_server`) in a process of its own, for runs
that must not lend it their event loop's CPU: started on a free loopback port, stopped with
SIGINT so it prints its final counters, with its CPU time and request counters at hand."""

from __future__ import annotations

import contextlib
import json
import selectors
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import httpx
import psutil  # type: ignore[import-untyped]

REPO_ROOT = Path(__file__).resolve().parent.parent


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process (its threads included)."""
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


@attrs.define(eq=False)
class EmbedServerProcess:
    """``python -m testkit.embed_server`` on a free loopback port; stop it on exit.

    ``latency_ms`` is the server's fixed delay per request (capacity per connection = batch /
    latency), ``max_batch_size`` is what it reports in ``/info`` and enforces (413 above).
    """

    latency_ms: float
    dimension: int
    max_batch_size: int | None = None
    log_path: Path | None = None
    url: str = ""
    final_stats: dict[str, Any] | None = None
    _process: subprocess.Popen[str] | None = None
    _log: Any = None

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    def __enter__(self) -> EmbedServerProcess:
        args = [sys.executable, "-m", "testkit.embed_server", "--port", "0", "--no-shuffle"]
        args += ["--dimension", str(self.dimension), "--latency-ms", str(self.latency_ms)]
        if self.max_batch_size is not None:
            args += ["--max-batch-size", str(self.max_batch_size)]
        self._log = self.log_path.open("ab") if self.log_path is not None else subprocess.DEVNULL
        self._process = subprocess.Popen(
            args,
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        line = self._read_line(30.0)
        prefix = "embed_server listening on "
        if not line.startswith(prefix):
            self.__exit__(None, None, None)
            raise RuntimeError(f"fake embedding server did not start: {line!r}")
        self.url = line[len(prefix) :].strip()
        return self

    def _read_line(self, limit_s: float) -> str:
        assert self._process is not None and self._process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self._process.stdout, selectors.EVENT_READ)
            if not selector.select(timeout=limit_s):
                return ""
        return self._process.stdout.readline()

    def __exit__(self, *exc: object) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)  # the server prints its stats and exits
            try:
                out, _ = process.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()  # our own child, by handle
                out, _ = process.communicate()
            with contextlib.suppress(ValueError, IndexError):
                self.final_stats = json.loads(out.strip().splitlines()[-1])
        if self._log not in (None, subprocess.DEVNULL):
            self._log.close()

    def cpu_seconds(self) -> float:
        times = psutil.Process(self.pid).cpu_times()
        return float(times.user + times.system)

    def stats(self) -> dict[str, Any]:
        response = httpx.get(f"{self.url}/_fake/stats", timeout=10)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def reset_stats(self) -> None:
        httpx.post(f"{self.url}/_fake/reset-stats", timeout=10).raise_for_status()
