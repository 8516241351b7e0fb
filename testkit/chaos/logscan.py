"""The chaos checks that read every log the product wrote: no secret, claim token, chunk
text or corpus marker in any of them, no traceback; and the worker warnings, counted by kind."""

from __future__ import annotations

import re
from collections import Counter

from testkit.chaos.corpus import marker_pattern
from testkit.chaos.evidence import Check, Observed, Stored, check
from testkit.embed_server import BODY_MARKER

_UUID = re.compile(
    r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}"
)
_TRACEBACK = "Traceback (most recent call last)"


def warning_kind(line: str, run_dir: str) -> str:
    """A worker's WARNING line without its time, paths, ids, keys and numbers, so that alike
    lines count together."""
    text = line.split(" WARNING ", 1)[1].strip().replace(run_dir, "<run>")
    text = re.sub(r"sha256/[0-9a-f]{2}/[0-9a-f]{64}", "<key>", text)
    text = _UUID.sub("<id>", text)
    text = re.sub(r"0x[0-9a-f]+", "<addr>", text)
    text = re.sub(r"\b\d+(?:\.\d+)?\b", "N", text)
    return text[:120]


def worker_warnings(seen: Observed) -> dict[str, int]:
    kinds: Counter[str] = Counter()
    for path in sorted(seen.logs.glob("worker-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if " WARNING " in line:
                kinds[warning_kind(line, str(seen.logs.parent))] += 1
    return dict(kinds.most_common())


def check_logs(seen: Observed, db: Stored) -> tuple[list[Check], int]:
    """``logs_clean`` and ``no_tracebacks``, and how many bytes of logs they read."""
    texts = {p.name: p.read_text(errors="replace") for p in sorted(seen.logs.iterdir())}
    joined = "\n".join(texts.values())
    markers = marker_pattern(seen.tag)
    # Tokens are found by pulling every UUID-shaped string out of the logs (with or without
    # dashes) rather than searching for each token: linear in the log size.
    leaked_tokens = sum(1 for found in _UUID.findall(joined) if _as_uuid(found) in db.tokens)
    leaked_texts = sum(1 for content in db.keys_of_text if content[:60] in joined)
    problems = []
    if not db.tokens:
        problems.append("the trap saw no claim token: the scan would prove nothing")
    if leaked_tokens:
        problems.append(f"{leaked_tokens} claim token occurrence(s)")
    if leaked_texts:
        problems.append(f"the text of {leaked_texts} chunk(s)")
    found_markers = markers.findall(joined)
    if found_markers:
        problems.append(f"{len(found_markers)} corpus marker word(s), e.g. {found_markers[0]}")
    if seen.secret in joined:
        problems.append("the S3 secret key")
    if BODY_MARKER in joined:
        problems.append("an embedding-server error body")
    leaking = sorted(
        name
        for name, text in texts.items()
        if seen.secret in text or BODY_MARKER in text or markers.search(text)
    )
    if leaking:
        problems.append(f"in {leaking[:5]}")
    clean = check(
        "logs_clean",
        problems,
        f"{len(texts)} log files ({len(joined) / 1e6:.1f} MB) hold none of {len(db.tokens)} claim "
        f"tokens, {len(db.keys_of_text)} chunk texts, the corpus markers, the S3 secret or an "
        "error body",
    )
    problems = [
        f"a traceback in {name} ({_last_line(text)})"
        for name, text in sorted(texts.items())
        if _TRACEBACK in text
    ]
    return [clean, check("no_tracebacks", problems, f"none in {len(texts)} logs")], len(joined)


def _last_line(text: str) -> str:
    """What a traceback ended with: the exception after rich's box, or the last line."""
    lines = text.splitlines()
    ends = [i for i, line in enumerate(lines) if line.startswith("╰")]
    tail = lines[ends[-1] + 1 :] if ends else lines[-1:]
    return " ".join(" ".join(tail).split())[:120]


def _as_uuid(text: str) -> str:
    plain = text.replace("-", "").lower()
    return f"{plain[:8]}-{plain[8:12]}-{plain[12:16]}-{plain[16:20]}-{plain[20:]}"
