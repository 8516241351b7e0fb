"""Text extraction on real files, by format: what is read, what is refused and why, CPU per MB
and peak memory (docs/test-results/formats.md).

    .venv/bin/python -m bench.formats /usr/share/doc other/folder ...

Every regular file under the folders is read with :func:`trioindex.pipeline.formats.extract_text`
(the parse step's extraction, without chunking) at the default maximum document size. Files are
grouped by the format detected, or by the refusal when detection refuses them; each group runs
in a process of its own, so its peak RSS above that process's start (parsers imported first)
is the group's memory. Refusals are counted by their message with numbers folded to N.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

MAX_BYTES = 50_000_000  # indexing.parsing.max-document-size's default, 50MB
_NUMBERS = re.compile(r"\d+(?:\.\d+)?")


def _files(folders: list[str]) -> list[Path]:
    found = []
    for folder in folders:
        for root, _dirs, names in os.walk(folder):
            for name in names:
                path = Path(root, name)
                if path.is_file() and not path.is_symlink():
                    found.append(path)
    return sorted(found)


def _group(path: Path) -> str:
    from trioindex.errors import ContentInvalid
    from trioindex.pipeline.formats import detect_format

    data = path.read_bytes()
    try:
        fmt = detect_format(data, path.name).value
    except ContentInvalid as exc:
        return "refused at detection: " + _NUMBERS.sub("N", exc.message)
    if fmt == "GZIP":
        from trioindex.pipeline.formats.compressed import gunzip, inner_name

        try:
            inner = gunzip(data, MAX_BYTES)
            return "GZIP of " + detect_format(inner, inner_name(path.name, data)).value
        except ContentInvalid:
            return "GZIP of ?"
    return fmt


def _refusal(message: str) -> str:
    if message.startswith("corrupt "):
        return message.split(" (", maxsplit=1)[0].split(":", maxsplit=1)[0]
    if message.startswith("empty document"):
        return "empty document"
    return _NUMBERS.sub("N", message)


def _cpu() -> float:
    """CPU seconds of this process and of the children it waited for (Tesseract runs)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _measure(paths: list[str]) -> dict[str, object]:
    """In this process: read every file; CPU, sizes, outcomes and peak RSS above the start."""
    import trioindex.pipeline.formats.extract as extract_module
    from trioindex.errors import ContentInvalid
    from trioindex.pipeline.formats import extract_text

    # the readers' modules and their parsers, so the baseline holds them
    for module, _function in extract_module._READERS.values():
        __import__(f"trioindex.pipeline.formats.{module}")
    import trioindex.pipeline.formats.html
    import trioindex.pipeline.formats.pdf  # noqa: F401

    start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    outcomes: collections.Counter[str] = collections.Counter()
    read_bytes = cpu_read = 0.0
    all_bytes = cpu_all = 0.0
    chars = 0
    for name in paths:
        data = Path(name).read_bytes()
        started = _cpu()
        try:
            text = extract_text(data, Path(name).name, max_bytes=MAX_BYTES).text
            outcomes["read"] += 1
            spent = _cpu() - started
            read_bytes += len(data)
            cpu_read += spent
            chars += len(text)
        except ContentInvalid as exc:
            outcomes[_refusal(exc.message)] += 1
            spent = _cpu() - started
        all_bytes += len(data)
        cpu_all += spent
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start_rss
    return {
        "files": len(paths),
        "outcomes": dict(outcomes),
        "mb": all_bytes / 1e6,
        "read_mb": read_bytes / 1e6,
        "cpu_ms_per_mb": 1000 * cpu_read / (read_bytes / 1e6) if read_bytes else None,
        "cpu_s": cpu_all,
        "chars": chars,
        "peak_rss_mib": peak / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # a JSON list of paths: one group
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(_measure(json.loads(Path(args.measure).read_text()))))
        return
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for path in _files(args.folders):
        groups[_group(path)].append(str(path))
    results = {}
    for group, paths in sorted(groups.items()):
        listing = Path(f"/tmp/bench-formats-{os.getpid()}.json")
        listing.write_text(json.dumps(paths))
        done = subprocess.run(
            [sys.executable, "-m", "bench.formats", "--measure", str(listing)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        listing.unlink()
        results[group] = json.loads(done.stdout)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print("| format | files | MB | read | refused (by message) | CPU ms/MB read | peak RSS MiB |")
    print("|---|---:|---:|---:|---|---:|---:|")
    for group, r in results.items():
        outcomes = dict(r["outcomes"])
        read = outcomes.pop("read", 0)
        refused = "; ".join(f"{n} {m}" for m, n in sorted(outcomes.items(), key=lambda x: -x[1]))
        cpu = "" if r["cpu_ms_per_mb"] is None else f"{r['cpu_ms_per_mb']:.0f}"
        print(
            f"| {group} | {r['files']} | {r['mb']:.1f} | {read} | {refused or '-'} | {cpu} "
            f"| {r['peak_rss_mib']:.0f} |"
        )


if __name__ == "__main__":
    main()
