"""What PPTX and XLSX share as Office Open XML packages: the main part, and relationship parts,
which name the part each reference (a slide, a sheet, a slide's notes) points to. Element names
are matched in any namespace, so Strict OOXML reads like the transitional kind."""

from __future__ import annotations

import posixpath
from typing import Any

from trioindex.pipeline.formats.detect import office_document
from trioindex.pipeline.formats.package import ZipPackage, local_name

__all__ = ["main_part", "relationship_id", "relationships"]


def main_part(package: ZipPackage, usual: str) -> str:
    """The package's main part: the one ``_rels/.rels`` names, else where Office puts it."""
    named, _content_type = office_document(package.names, package.read)
    return named or usual


def relationship_id(element: Any) -> str:
    """An element's ``r:id`` (transitional or Strict namespace), "" when it has none."""
    for key, value in element.attrib.items():
        if key.endswith("}id"):
            return str(value)
    return ""


def relationships(package: ZipPackage, part: str) -> dict[str, tuple[str, str]]:
    """``{id: (type, part name)}`` of ``part``'s internal relationships (``type`` is the last
    segment of the relationship type: ``slide``, ``notesSlide``, ``worksheet``)."""
    folder, base = posixpath.split(part)
    rels = posixpath.join(folder, "_rels", base + ".rels")
    if rels not in package.names:
        return {}
    found: dict[str, tuple[str, str]] = {}
    for rel in package.tree(rels):
        if local_name(rel.tag) != "Relationship" or rel.get("TargetMode") == "External":
            continue
        target = rel.get("Target") or ""
        # a target is relative to the part's folder, or absolute from the package root
        path = target.lstrip("/") if target.startswith("/") else posixpath.join(folder, target)
        kind = (rel.get("Type") or "").rsplit("/", 1)[-1]
        found[rel.get("Id") or ""] = (kind, posixpath.normpath(path))
    return found
