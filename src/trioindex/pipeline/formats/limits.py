"""Every bound on the work one document can cause, in one place.

Each limit applies before a single byte of the document is inflated or interpreted; the parse
step's timeout (``indexing.parsing.timeout``) is the backstop for the rest. README "Limits on one
document" lists them for users, with the message each refusal gives.
"""

from __future__ import annotations

__all__ = [
    "EML_MAX_DEPTH",
    "EML_MAX_PARTS",
    "GZIP_EXPANSION_RATIO",
    "GZIP_MIN_CAP",
    "GZIP_READ_BLOCK",
    "IMAGE_MAX_PIXELS",
    "OCR_MAX_PAGES",
    "OCR_MAX_PIXELS",
    "PDF_CONTENT_EXPANSION",
    "PDF_MAX_PAGES",
    "PDF_MAX_PAGE_CONTENT",
    "PDF_MIN_CONTENT_BUDGET",
    "RTF_MAX_DEPTH",
    "TEXT_EXPANSION_LIMIT",
    "UTF8_EVIDENCE_PER_REPAIR",
    "UTF8_MIN_REPAIRS",
    "UTF8_REPAIR_BYTES",
    "XML_MAX_DEPTH",
    "ZIP_EXPANSION_LIMIT",
    "ZIP_EXPANSION_RATIO",
    "ZIP_MAX_ENTRIES",
    "ZIP_MAX_XML_BYTES",
    "ZIP_MIN_UNCOMPRESSED_CAP",
    "ZIP_READ_BLOCK",
    "MiB",
]

MiB = 1024 * 1024

# DOCX, PPTX, XLSX, OpenDocument, EPUB and HWPX files are ZIPs of XML. Real ones inflate 8-30x
# (a table of identical empty cells ~100x); the DOCX bomb in the issue inflated 680x. Total
# uncompressed size: at most ZIP_EXPANSION_RATIO x the file (floor ZIP_MIN_UNCOMPRESSED_CAP: an
# empty Word file already carries ~0.8 MB of styles), and never over ZIP_EXPANSION_LIMIT x the
# configured maximum size. XML parsed into a tree (~20x its size in memory) is capped absolutely:
# all of a DOCX's parts (python-docx parses them all), one part for the other readers (they
# stream the large ones). Elements nest at most XML_MAX_DEPTH deep (real files: under 40).
ZIP_EXPANSION_RATIO = 200
ZIP_EXPANSION_LIMIT = 8
ZIP_MIN_UNCOMPRESSED_CAP = 8 * MiB
ZIP_MAX_XML_BYTES = 32 * MiB
ZIP_MAX_ENTRIES = 10_000
ZIP_READ_BLOCK = 256 * 1024  # inflation is counted one block at a time, never kept
XML_MAX_DEPTH = 128
# OCR: an image declaring more than IMAGE_MAX_PIXELS is refused before it is decoded (40 MP of
# grey is 40 MB); what Tesseract reads is scaled down to OCR_MAX_PIXELS (an A4 page at 400 dpi
# is 15.5 MP, at 300 dpi 8.7 MP); at most OCR_MAX_PAGES pages, each within the OCR policy's
# page_seconds.
IMAGE_MAX_PIXELS = 40_000_000
OCR_MAX_PIXELS = 12_000_000
OCR_MAX_PAGES = 200
# An e-mail's MIME parts: at most EML_MAX_PARTS, nested at most EML_MAX_DEPTH deep (real
# messages: a few parts, 3-4 deep).
EML_MAX_PARTS = 1000
EML_MAX_DEPTH = 32
# RTF groups ({...}) nest at most this deep (Word writes under 20).
RTF_MAX_DEPTH = 128
# A gzip file inflates to at most GZIP_EXPANSION_RATIO x its size (floor GZIP_MIN_CAP) and never
# past the configured maximum size (the limit the same file would meet uncompressed). Text
# compresses 3-10x; of 1,939 gzip files under /usr/share/doc the densest inflated 28x.
GZIP_EXPANSION_RATIO = 100
GZIP_MIN_CAP = 1 * MiB
GZIP_READ_BLOCK = 256 * 1024  # compressed bytes fed to zlib at a time
# Extracted text beyond this multiple of the file size means a crafted file (PDF content streams
# are compressed too); refuse it instead of handing the chunker gigabytes.
TEXT_EXPANSION_LIMIT = 8
# pypdf interprets page content at ~1 MB/s and a 10 KiB PDF can point every page at one 3.5 MiB
# stream, so content is budgeted before it is interpreted: per page (its content streams and
# the form XObjects it uses) at most the total budget and PDF_MAX_PAGE_CONTENT; all pages
# together at most PDF_CONTENT_EXPANSION x the file size (floor PDF_MIN_CONTENT_BUDGET, and
# never over TEXT_EXPANSION_LIMIT x the configured maximum). Real PDFs stay under ~10x.
PDF_MAX_PAGES = 10_000
PDF_CONTENT_EXPANSION = 32
PDF_MIN_CONTENT_BUDGET = 1 * MiB
PDF_MAX_PAGE_CONTENT = 16 * MiB
# Almost-UTF-8 text: UTF8_MIN_REPAIRS invalid sequences tolerated (one stray byte inside a
# character leaves up to three), plus one per UTF8_REPAIR_BYTES; and at least
# UTF8_EVIDENCE_PER_REPAIR bytes of valid multi-byte characters (the bytes beyond the first of
# each: 16 = 8 Hangul syllables) per replaced sequence as evidence that the file is UTF-8.
UTF8_MIN_REPAIRS = 4
UTF8_REPAIR_BYTES = 256 * 1024
UTF8_EVIDENCE_PER_REPAIR = 16
