"""ZIP packages of XML (DOCX, PPTX, XLSX, OpenDocument, EPUB, HWPX), opened under the zip-bomb
bounds, and their XML parsed without entities, network or unbounded depth.

A small ZIP can inflate to gigabytes. :meth:`ZipPackage.open` refuses one by the sizes its
directory declares before anything is inflated, and zipfile stops every part at its declared
size (a forged size fails the part's CRC: corrupt), so what a reader inflates is bounded by
what was checked. :meth:`ZipPackage.verify` also inflates every part once, counting, for the
readers that hand the whole package to a library (python-docx). The caps are in :mod:`.limits`.

XML is read two ways: :meth:`ZipPackage.tree` parses one part whole (at most
:data:`ZIP_MAX_XML_BYTES`), :meth:`ZipPackage.events` streams a part of any size; both refuse
elements nested deeper than :data:`XML_MAX_DEPTH` and never load a DTD or resolve an entity.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterable, Iterator
from typing import Any

import attrs

# lxml (a dependency of python-docx) ships no type hints.
from lxml import etree  # type: ignore[import-untyped]

from trioindex.errors import ContentInvalid
from trioindex.pipeline.formats.detect import zip_name
from trioindex.pipeline.formats.limits import (
    XML_MAX_DEPTH,
    ZIP_EXPANSION_LIMIT,
    ZIP_EXPANSION_RATIO,
    ZIP_MAX_ENTRIES,
    ZIP_MAX_XML_BYTES,
    ZIP_MIN_UNCOMPRESSED_CAP,
    ZIP_READ_BLOCK,
)
from trioindex.pipeline.formats.messages import size_text

__all__ = ["ZipPackage", "inflation_cap", "local_name", "release", "texts"]


def inflation_cap(size: int, max_bytes: int) -> int:
    """Total uncompressed bytes a package of ``size`` bytes may hold (see :mod:`.limits`); also
    what an HWP 5.0 file's compressed sections may inflate to."""
    relative = max(ZIP_MIN_UNCOMPRESSED_CAP, ZIP_EXPANSION_RATIO * size)
    return min(relative, max(ZIP_EXPANSION_LIMIT * max_bytes, ZIP_MIN_UNCOMPRESSED_CAP))


def _is_xml_part(name: str) -> bool:
    return name.endswith((".xml", ".rels"))


@attrs.define
class _Inflation:
    """Running totals of a package's uncompressed bytes, checked against the caps."""

    kind: str
    file_size: int
    cap: int
    xml_cap: int | None  # None: XML parts are not capped apart from the rest
    total: int = 0
    xml: int = 0

    def add(self, name: str, n: int) -> None:
        self.total += n
        if _is_xml_part(name):
            self.xml += n
        if self.total > self.cap:
            raise ContentInvalid(
                f"{self.kind} expands to more than {size_text(self.cap)} (the limit for a "
                f"{size_text(self.file_size)} file); decompression bomb or oversized"
            )
        if self.xml_cap is not None and self.xml > self.xml_cap:
            raise ContentInvalid(
                f"{self.kind} holds more than {size_text(self.xml_cap)} of XML (the limit); "
                "decompression bomb or oversized"
            )


class ZipPackage:
    """An open ZIP package whose declared sizes are within the caps (:meth:`open`)."""

    def __init__(self, archive: zipfile.ZipFile, kind: str, inflation: _Inflation) -> None:
        self._archive = archive
        self._inflation = inflation
        self.kind = kind
        self._infos = {zip_name(info): info for info in archive.infolist()}
        self.names = frozenset(self._infos)

    @classmethod
    def open(
        cls, data: bytes, kind: str, max_bytes: int, *, cap_all_xml: bool = False
    ) -> ZipPackage:
        """The package in ``data``, refused (:class:`ContentInvalid`) when its directory is
        unreadable, lists over :data:`ZIP_MAX_ENTRIES` parts or declares more than the caps.

        ``cap_all_xml``: the XML parts together may hold at most :data:`ZIP_MAX_XML_BYTES`
        (for a reader that parses them all into trees at once)."""
        try:
            archive = zipfile.ZipFile(io.BytesIO(data))
            infos = archive.infolist()
        except Exception as exc:  # BadZipFile, ValueError, OSError, ... on damaged input
            raise ContentInvalid(f"corrupt {kind}: unreadable ZIP package") from exc
        if len(infos) > ZIP_MAX_ENTRIES:
            raise ContentInvalid(
                f"{kind} has {len(infos)} package parts, over the limit of {ZIP_MAX_ENTRIES}"
            )
        inflation = _Inflation(
            kind,
            len(data),
            inflation_cap(len(data), max_bytes),
            ZIP_MAX_XML_BYTES if cap_all_xml else None,
        )
        for info in infos:
            inflation.add(info.filename, info.file_size)
        return cls(archive, kind, inflation)

    def verify(self) -> None:
        """Inflate every part once, counting block by block and checking its CRC; nothing is
        kept (one block of memory). For readers that give the package to a library."""
        counted = attrs.evolve(self._inflation, total=0, xml=0)
        for info in self._archive.infolist():
            with self._archive.open(info) as part:
                while block := part.read(ZIP_READ_BLOCK):
                    counted.add(info.filename, len(block))

    def read(self, name: str) -> bytes:
        """One part's bytes (``KeyError`` when there is none). Names use ``/``."""
        return self._archive.read(self._infos[name])

    def tree(self, name: str) -> Any:
        """One XML part parsed whole: at most :data:`ZIP_MAX_XML_BYTES`, depth bounded."""
        size = self._infos[name].file_size
        if size > ZIP_MAX_XML_BYTES:
            raise ContentInvalid(
                f"{self.kind} has an XML part of more than {size_text(ZIP_MAX_XML_BYTES)} "
                "(the limit for a part read whole)"
            )
        with self._archive.open(self._infos[name]) as part:
            parser = _xml_parser(part)
            for _event in _depth_checked(parser, self.kind):
                pass
            return parser.root

    def events(self, name: str) -> Iterator[tuple[str, Any]]:
        """``("start" | "end", element)`` for every element of an XML part, streamed.

        The tree grows as it is read: the caller drops what it is done with
        (:func:`release`) to keep memory near one element's worth."""
        with self._archive.open(self._infos[name]) as part:
            yield from _depth_checked(_xml_parser(part), self.kind)

    def check_depth(self, name: str) -> None:
        """Stream one XML part only to refuse it when nested too deep (for a part a library
        parses itself), dropping each element once ended."""
        for event, element in self.events(name):
            if event == "end":
                release(element)


def _xml_parser(source: Any) -> Any:
    """libxml2 reading ``source`` incrementally: no DTD, no entities, no network."""
    return etree.iterparse(
        source,
        events=("start", "end"),
        resolve_entities=False,
        load_dtd=False,
        no_network=True,
        huge_tree=False,
        remove_comments=True,
        remove_pis=True,
    )


def _depth_checked(parser: Any, kind: str) -> Iterator[tuple[str, Any]]:
    depth = 0
    for event, element in parser:
        depth += 1 if event == "start" else -1
        if depth > XML_MAX_DEPTH:
            raise ContentInvalid(
                f"{kind} XML nests elements deeper than {XML_MAX_DEPTH} levels (the limit)"
            )
        yield event, element


def release(element: Any) -> None:
    """Drop an ended element's content and the siblings before it (streamed parsing)."""
    element.clear(keep_tail=True)
    parent = element.getparent()
    if parent is not None:
        while element.getprevious() is not None:
            del parent[0]


def local_name(tag: Any) -> str:
    """``{namespace}name`` -> ``name`` (comments and entities, whose tag is not a str: "")."""
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def texts(element: Any, tags: Iterable[str]) -> Iterator[str]:
    """The text of every descendant of ``element`` whose local name is in ``tags``."""
    wanted = frozenset(tags)
    for node in element.iter():
        if local_name(node.tag) in wanted and node.text:
            yield node.text
