"""What PPTX and XLSX share as Office Open XML packages: relationship parts, which name the
part each reference (a slide, a sheet, a slide's notes) points to."""

from __future__ import annotations

import posixpath

from trioindex.pipeline.formats.package import ZipPackage, local_name

__all__ = ["R_NS", "relationships"]

R_NS = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"


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
