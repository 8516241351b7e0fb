"""PPTX to text: each slide's title as a heading, then its text frames and tables in the
order of the slide's shape tree, then its speaker notes.

Read with zipfile and lxml under the package bounds (:mod:`.package`): the presentation part
gives the slides' order, each slide part is parsed whole (slides are small; one part is capped)
and written through :mod:`.flow` (paragraphs, table rows as lines). A slide without a title is
headed ``Slide N``. Slide numbers, dates and footers are left out, as are charts and pictures.
"""

from __future__ import annotations

from typing import Any

from lxml import etree  # type: ignore[import-untyped]

from trioindex.pipeline.formats.flow import FlowTags, write_flow
from trioindex.pipeline.formats.messages import refused_as_corrupt
from trioindex.pipeline.formats.ooxml import main_part, relationship_id, relationships
from trioindex.pipeline.formats.outline import Outline
from trioindex.pipeline.formats.package import ZipPackage

__all__ = ["pptx_text"]

# any namespace: transitional and Strict OOXML name these alike
_SHAPE = "{*}sp"
_PLACEHOLDER = "{*}nvSpPr/{*}nvPr/{*}ph"
_TITLES = frozenset({"title", "ctrTitle"})
# placeholders whose text is not the slide's: numbers, dates, footers, the notes' slide image
_LEFT_OUT = frozenset({"sldNum", "dt", "ftr", "hdr", "sldImg"})


def _placeholder(shape: Any) -> str | None:
    ph = shape.find(_PLACEHOLDER)
    return None if ph is None else (ph.get("type") or "body")


def _shape_of(paragraph: Any) -> Any:
    return next(paragraph.iterancestors(_SHAPE), None)


def _kept(paragraph: Any) -> bool:
    shape = _shape_of(paragraph)
    kind = None if shape is None else _placeholder(shape)
    return kind not in _TITLES and kind not in _LEFT_OUT


_TAGS = FlowTags(
    paragraph=frozenset({"p"}),  # a:p (PresentationML has no element named p)
    row=frozenset({"tr"}),
    cell=frozenset({"tc"}),
    text=frozenset({"t"}),
    marks={"br": lambda element: "\n"},
    keep=_kept,
)


def _title(slide: Any) -> str:
    for shape in slide.iter(_SHAPE):
        if _placeholder(shape) in _TITLES:
            words = (t.text or "" for t in shape.iter("{*}t"))
            title = " ".join("".join(words).split())
            if title:
                return title
    return ""


def pptx_text(data: bytes, max_bytes: int, max_chars: int) -> str:
    """The slides' text, in presentation order (module docstring)."""
    out = Outline("PPTX", max_chars)
    with refused_as_corrupt("PPTX"):
        package = ZipPackage.open(data, "PPTX", max_bytes)
        root = main_part(package, "ppt/presentation.xml")
        slides = relationships(package, root)
        order = package.tree(root).find("{*}sldIdLst")
        for number, ref in enumerate(() if order is None else order, 1):
            kind, part = slides.get(relationship_id(ref), ("", ""))
            if kind != "slide" or part not in package.names:
                continue
            slide = package.tree(part)
            out.heading(_title(slide) or f"Slide {number}")
            write_flow(etree.iterwalk(slide, events=("start", "end")), _TAGS, out)
            for kind, notes in relationships(package, part).values():
                if kind == "notesSlide" and notes in package.names:
                    notes_tree = package.tree(notes)
                    write_flow(etree.iterwalk(notes_tree, events=("start", "end")), _TAGS, out)
    return out.text()
