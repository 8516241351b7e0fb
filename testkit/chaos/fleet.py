"""The chaos run's processes: the worker fleet (start, ``kill -9``, notice exits, stop with
SIGTERM) and the ingest waves (``trioindex ingest DIR --json``, retried after a failure)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from testkit.processes import REPO_ROOT


@attrs.define(eq=False)
class WorkerProcess:
    number: int
    popen: subprocess.Popen[bytes]
    log: Path
    started_at: float
    ended_at: float | None = None
    fate: str = "running"  # running | killed | exited | stopped | hung
    returncode: int | None = None

    def registered(self) -> bool:
        return " registered (max-concurrency" in self.log.read_text(errors="replace")


@attrs.define(eq=False)
class Fleet:
    """The worker processes: start, kill -9, notice exits, stop with SIGTERM."""

    env: dict[str, str]
    logs: Path
    clock: Callable[[], float]
    processes: list[WorkerProcess] = attrs.Factory(list)

    def start_one(self) -> WorkerProcess:
        number = len(self.processes) + 1
        log = self.logs / f"worker-{number:03d}.log"
        with log.open("ab") as handle:
            popen = subprocess.Popen(
                [sys.executable, "-m", "trioindex.cli", "worker"],
                env=self.env,
                stdout=handle,
                stderr=handle,
                cwd=REPO_ROOT,
            )
        process = WorkerProcess(number, popen, log, self.clock())
        self.processes.append(process)
        return process

    def live(self) -> list[WorkerProcess]:
        return [p for p in self.processes if p.fate == "running"]

    def kill(self, victim: WorkerProcess) -> None:
        victim.popen.kill()  # SIGKILL: no cleanup at all
        victim.returncode = victim.popen.wait(timeout=30)
        victim.ended_at = self.clock()
        victim.fate = "killed"

    def reap(self) -> list[WorkerProcess]:
        """Workers that exited on their own since the last call."""
        exited = []
        for process in self.live():
            code = process.popen.poll()
            if code is not None:
                process.returncode = code
                process.ended_at = self.clock()
                process.fate = "exited"
                exited.append(process)
        return exited

    def wait_registered(self, timeout: float) -> list[WorkerProcess]:
        """Wait until every live worker has registered; return those that did not in time."""
        deadline = time.monotonic() + timeout
        while True:
            waiting = [p for p in self.live() if not p.registered()]
            if not waiting or time.monotonic() >= deadline:
                return waiting
            time.sleep(0.1)

    def stop_all(self, timeout: float) -> None:
        live = self.live()
        for process in live:
            process.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for process in live:
            try:
                process.returncode = process.popen.wait(max(0.0, deadline - time.monotonic()))
                process.fate = "stopped"
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.returncode = process.popen.wait()
                process.fate = "hung"
            process.ended_at = self.clock()

    def kill_all(self) -> None:
        for process in self.live():
            process.popen.kill()
            process.popen.wait()
            process.fate = "killed"


@attrs.define(eq=False)
class IngestWave:
    number: int
    folder: Path
    due: float
    tries: int = 0
    done_at: float | None = None
    results: list[dict[str, Any]] = attrs.Factory(list)


@attrs.define(eq=False)
class Ingestor:
    """Runs ``trioindex ingest DIR --json`` for each wave when due, one at a time, and again
    after a failure (ingest is idempotent: an unchanged file is not enqueued twice)."""

    env: dict[str, str]
    logs: Path
    pending: list[IngestWave]
    done: list[IngestWave] = attrs.Factory(list)
    failures: int = 0
    _current: tuple[IngestWave, subprocess.Popen[bytes], Path] | None = None
    _retry_at: float = 0.0

    @property
    def idle(self) -> bool:
        return self._current is None and not self.pending

    def tick(self, now: float) -> list[str]:
        """Advance; return timeline notes."""
        notes: list[str] = []
        if self._current is not None:
            wave, popen, out = self._current
            code = popen.poll()
            if code is None:
                return notes
            self._current = None
            if code == 0:
                wave.results = [json.loads(line) for line in out.read_text().splitlines() if line]
                wave.done_at = now
                self.done.append(wave)
                self.pending.remove(wave)
                notes.append(f"ingest wave {wave.number} done ({len(wave.results)} files)")
            else:
                self.failures += 1
                self._retry_at = now + 1.0
                notes.append(f"ingest wave {wave.number} failed (status {code}); retrying")
        if self.pending and self.pending[0].due <= now and now >= self._retry_at:
            wave = self.pending[0]
            wave.tries += 1
            out = self.logs / f"ingest-{wave.number}-{wave.tries}.out"
            err = self.logs / f"ingest-{wave.number}-{wave.tries}.log"
            with out.open("wb") as stdout, err.open("wb") as stderr:
                popen = subprocess.Popen(
                    [sys.executable, "-m", "trioindex.cli", "ingest", str(wave.folder), "--json"],
                    env=self.env,
                    stdout=stdout,
                    stderr=stderr,
                    cwd=REPO_ROOT,
                )
            self._current = (wave, popen, out)
            notes.append(f"ingest wave {wave.number} started (try {wave.tries})")
        return notes

    def kill(self) -> None:
        if self._current is not None:
            self._current[1].kill()
            self._current[1].wait()
