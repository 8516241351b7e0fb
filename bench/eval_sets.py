"""The labelled sets `just eval` ranks: documents, queries and each query's relevant documents.

**known-item** (texts installed on this machine) — each manual page (`/usr/share/man/man1`, a
fixed sample, and every Korean page under `/usr/share/man/ko`) is a document without its NAME
line, and the NAME line's description ("print lines that match patterns") is the query whose
one relevant document is that page; each lesson of the Vim tutor (English and Korean) is a
document without its title, and the title is the query.

**progit** (real questions over real documents) — the sections of the book *Pro Git* (2nd
edition, CC BY-NC-SA 3.0: github.com/progit/progit2 at commit 55b541e, and its Korean
translation github.com/progit/progit2-ko at f50647d), one document per `book/*/sections/*.asc`
file of each (84 + 84), AsciiDoc as written, the Korean files without the English original
they keep in `////` comment blocks. The questions (`bench/data/progit-questions.tsv`, 51
English, 40 Korean) were written for this set by a helper of the project as a user would ask
them, phrased apart from the book's headings, each labelled with the section that answers it
in its own language's book; a label is kept only if that section holds the answer's key
term (the file's fourth column: the harness checks it). The labels are one relevant section
per question: a question another section also answers counts that one as a miss, so the
figures are lower bounds. Both books are in one index: an English question may find a Korean
section (it holds the same commands), which counts as a miss. The books are read with git
from clones given by `--progit` and `--progit-ko` (or `TRIOINDEX_EVAL_PROGIT`,
`TRIOINDEX_EVAL_PROGIT_KO`); without them this set is skipped, with a note.
"""

from __future__ import annotations

import gzip
import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

import attrs

MAN = Path("/usr/share/man")
TUTOR = Path("/usr/share/vim/vim90/tutor")
QUESTIONS = Path(__file__).resolve().parent / "data" / "progit-questions.tsv"
PROGIT_COMMITS = {
    "en": "55b541e9e6d747208a76a15d1f1e01463093f67b",
    "ko": "f50647da032bf210ef91802290d60d05da1a9416",
}


@attrs.frozen
class Query:
    text: str
    relevant: frozenset[str]
    lang: str


@attrs.frozen
class LabelledSet:
    name: str
    documents: tuple[tuple[str, str], ...]  # (key, text)
    queries: tuple[Query, ...]


# -- known-item ---------------------------------------------------------------------------------


def roff_text(source: str) -> tuple[str, str]:
    """A manual page's NAME description and the rest as plain text (good enough for search)."""
    description, lines, section = "", [], ""
    for line in source.splitlines():
        if line.startswith(('.\\"', "'\\\"")):
            continue
        if line.startswith(".SH"):
            section = line[3:].strip().strip('"')
            lines += ["", section, ""]
            continue
        text = re.sub(r"\\f(\[[^]]*\]|\(..|.)|\\&|\\[cd]", "", line)
        text = text.replace("\\-", "-").replace("\\ ", " ").replace("\\(em", "—")
        if text.startswith("."):
            text = text.split(" ", 1)[1] if " " in text else ""
        if section in ("NAME", "이름") and not description and " - " in text:
            description = text.split(" - ", 1)[1].strip()
            continue
        lines.append(text)
    return description, re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def man_pages(folders: Sequence[Path], take: int, lang: str) -> list[tuple[str, str, str, str]]:
    """``(key, text, query, language)`` per page with a description of 3+ words."""
    found = []
    for path in sorted(p for f in folders for p in f.glob("*.gz") if p.exists()):
        source = gzip.decompress(path.read_bytes()).decode("utf-8", "replace")
        if source.lstrip().startswith(".so"):
            continue
        query, text = roff_text(source)
        if len(query.split()) >= 3 and 1000 <= len(text) <= 20_000:
            found.append((f"man/{lang}/{path.name[:-3]}", text, query, lang))
    step = max(1, len(found) // take)
    return found[::step][:take]


def tutor_lessons(path: Path, lang: str) -> list[tuple[str, str, str, str]]:
    text = path.read_text(encoding="utf-8", errors="replace")
    parts = re.split(r"^\s*Lesson (\d+\.\d+(?:\.\d+)?):\s*(.+)$", text, flags=re.M)
    return [
        (f"tutor/{lang}/{num}", body.strip("~ \n"), title.strip(), lang)
        for num, title, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True)
        if len(title.split()) >= 2 or lang == "ko"
    ]


def known_items(english_pages: int) -> LabelledSet:
    items = (
        man_pages([MAN / "man1"], english_pages, "en")
        + man_pages(sorted((MAN / "ko").glob("man*")), 1000, "ko")
        + tutor_lessons(TUTOR / "tutor", "en")
        + tutor_lessons(TUTOR / "tutor.ko.utf-8", "ko")
    )
    return LabelledSet(
        "known-item",
        tuple((key, text) for key, text, _, _ in items),
        tuple(Query(query, frozenset([key]), lang) for key, _, query, lang in items),
    )


# -- progit -------------------------------------------------------------------------------------

_COMMENT_BLOCK = re.compile(r"^/{4,}[ \t]*\n.*?^/{4,}[ \t]*\n", re.S | re.M)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout


def _git_dir(path: Path) -> Path:
    return path / ".git" if (path / ".git").is_dir() else path


def progit(en_repo: str | None, ko_repo: str | None) -> LabelledSet | None:
    """The progit set (module docstring), or None when a book's clone is not given."""
    repos = {
        "en": en_repo or os.environ.get("TRIOINDEX_EVAL_PROGIT"),
        "ko": ko_repo or os.environ.get("TRIOINDEX_EVAL_PROGIT_KO"),
    }
    if not all(repos.values()):
        return None
    documents: dict[str, str] = {}
    for lang, repo in repos.items():
        assert repo is not None
        git_dir, commit = _git_dir(Path(repo)), PROGIT_COMMITS[lang]
        for path in _git(git_dir, "ls-tree", "-r", "--name-only", commit, "book").splitlines():
            if re.fullmatch(r"book/[^/]+/sections/[^/]+\.asc", path):
                text = _COMMENT_BLOCK.sub("", _git(git_dir, "show", f"{commit}:{path}"))
                documents[f"progit/{lang}/{path[len('book/') : -len('.asc')]}"] = text
    queries = []
    for line in QUESTIONS.read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#"):
            continue
        lang, question, relevant, check = line.split("\t")
        keys = frozenset(f"progit/{lang}/{r}" for r in relevant.split(","))
        for key in keys:
            if check not in documents[key]:
                raise ValueError(f"{key} does not hold {check!r}: the label of {question!r}")
        queries.append(Query(question, keys, lang))
    return LabelledSet("progit", tuple(documents.items()), tuple(queries))
