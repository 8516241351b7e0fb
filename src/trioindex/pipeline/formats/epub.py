"""EPUB to text: the visible text of each spine document, in reading order.

Read with zipfile and lxml under the package bounds (:mod:`.package`): ``META-INF/container.xml``
names the package document, whose spine orders its XHTML documents; each is decoded and read
like an HTML page (:mod:`.html`, without its ``<title>``: chapters repeat the book's) and
becomes one block of paragraphs. The EPUB 3 navigation document (the table of contents),
images, styles and fonts are left out; an encrypted (DRM) book is refused.
"""

from __future__ import annotations

import posixpath
import urllib.parse

from trioindex.errors import ContentInvalid
from trioindex.pipeline.formats.detect import DocumentFormat
from trioindex.pipeline.formats.html import html_text
from trioindex.pipeline.formats.messages import refused_as_corrupt
from trioindex.pipeline.formats.outline import Outline
from trioindex.pipeline.formats.package import ZipPackage
from trioindex.pipeline.formats.text import decode, normalise

__all__ = ["epub_text"]

_CONTAINER = "META-INF/container.xml"
_ENCRYPTION = "META-INF/encryption.xml"
_XHTML = frozenset({"application/xhtml+xml", "text/html"})


def _package_document(package: ZipPackage) -> str:
    for rootfile in package.tree(_CONTAINER).iter("{*}rootfile"):
        path = rootfile.get("full-path") or ""
        if path in package.names:
            return path
    raise ContentInvalid("corrupt EPUB: no package document")


def _spine(package: ZipPackage, opf: str) -> list[str]:
    """The part names of the spine's XHTML documents, in reading order."""
    root = package.tree(opf)
    folder = posixpath.dirname(opf)
    items: dict[str, str] = {}
    for item in root.iter("{*}item"):
        navigation = "nav" in (item.get("properties") or "").split()  # the table of contents
        if (item.get("media-type") or "") in _XHTML and not navigation:
            href = urllib.parse.unquote((item.get("href") or "").split("#", 1)[0])
            items[item.get("id") or ""] = posixpath.normpath(posixpath.join(folder, href))
    order = (items.get(ref.get("idref") or "") for ref in root.iter("{*}itemref"))
    return [part for part in order if part is not None and part in package.names]


def _encrypted(package: ZipPackage) -> bool:
    """Whether the book's documents are encrypted (fonts alone may be obfuscated: readable)."""
    if _ENCRYPTION not in package.names:
        return False
    for reference in package.tree(_ENCRYPTION).iter("{*}CipherReference"):
        uri = reference.get("URI") or ""
        if uri.lower().endswith((".xhtml", ".html", ".htm")):
            return True
    return False


def epub_text(data: bytes, max_bytes: int, max_chars: int) -> str:
    """The book's text in reading order (module docstring)."""
    out = Outline("EPUB", max_chars)
    with refused_as_corrupt("EPUB"):
        package = ZipPackage.open(data, "EPUB", max_bytes)
        if _encrypted(package):
            raise ContentInvalid("EPUB is encrypted (DRM): its text cannot be read")
        for part in _spine(package, _package_document(package)):
            page, _replaced = decode(package.read(part), DocumentFormat.HTML, None)
            out.paragraph(html_text(normalise(page), title=False))
    return out.text()
