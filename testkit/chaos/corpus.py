"""The chaos corpus: real documents of every format, each sentence carrying a marker word unique
to the run, plus invalid files on purpose (empty, random bytes named ``.pdf``, truncated
``.docx``), spread over ingest waves."""

from __future__ import annotations

import random
import re
from pathlib import Path

import attrs

from testkit.chaos.plan import INVALID_SHARE, LONG_EVERY, LONG_SENTENCES, WAVES
from testkit.documents import FORMATS, TOPICS, document_bytes, docx_bytes

VALID_FORMATS = FORMATS
INVALID_KINDS = ("empty", "binary-pdf", "truncated-docx")
_INVALID_FILES = {
    "empty": "empty.txt",
    "binary-pdf": "binary.pdf",
    "truncated-docx": "truncated.docx",
}


def marker_pattern(tag: str) -> re.Pattern[str]:
    """Every sentence of the corpus carries one of these words, and nothing else does."""
    return re.compile(rf"cxm{tag}d\d{{4}}s\d{{3}}")


@attrs.frozen
class CorpusFile:
    key: str  # the file name, which `trioindex ingest DIR` makes the document key
    wave: int
    kind: str  # a VALID_FORMATS entry, or an INVALID_KINDS entry

    @property
    def valid(self) -> bool:
        return self.kind in VALID_FORMATS


def _sentences(rng: random.Random, tag: str, number: int, count: int, *, latin: bool) -> list[str]:
    topics = [t for t in TOPICS if not (latin and t[0] == "korean")]
    _, sentence = rng.choice(topics)
    return [f"{sentence} (cxm{tag}d{number:04d}s{j:03d})" for j in range(count)]


def _invalid_bytes(kind: str, rng: random.Random) -> bytes:
    if kind == "empty":
        return b""
    if kind == "binary-pdf":
        return rng.randbytes(rng.randint(2_000, 20_000))
    whole = docx_bytes("truncated", [f"cut short {rng.random()}" * 20])
    return whole[: int(len(whole) * rng.uniform(0.3, 0.8))]


def make_corpus(
    folder: Path, documents: int, rng: random.Random, tag: str, *, waves: int = len(WAVES)
) -> list[CorpusFile]:
    """``documents`` files in ``folder/wave-N/``: real documents of every format (each sentence
    carrying a unique marker word) and about INVALID_SHARE of them invalid on purpose."""
    invalid = max(len(INVALID_KINDS), round(documents * INVALID_SHARE))
    if documents < invalid + len(VALID_FORMATS):
        raise SystemExit(f"--documents must be at least {invalid + len(VALID_FORMATS)}")
    kinds = [INVALID_KINDS[i % len(INVALID_KINDS)] for i in range(invalid)]
    kinds += [VALID_FORMATS[i % len(VALID_FORMATS)] for i in range(documents - invalid)]
    rng.shuffle(kinds)
    files: list[CorpusFile] = []
    valid_seen = 0
    for number, kind in enumerate(kinds):
        wave = number % waves
        if kind in VALID_FORMATS:
            valid_seen += 1
            key = f"{number:04d}-doc.{kind}"
            long = valid_seen % LONG_EVERY == 0
            count = LONG_SENTENCES if long else rng.randint(6, 30)
            sentences = _sentences(rng, tag, number, count, latin=kind == "pdf")
            paragraphs = [" ".join(sentences[i : i + 5]) for i in range(0, len(sentences), 5)]
            title = f"chaos document {number}"
            head = f"<title>{title}</title><style>p{{color:red}}</style>"
            data = document_bytes(kind, title, paragraphs, html_head=head)
        else:
            key = f"{number:04d}-{_INVALID_FILES[kind]}"
            data = _invalid_bytes(kind, rng)
        path = folder / f"wave-{wave}" / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        files.append(CorpusFile(key=key, wave=wave, kind=kind))
    return files
