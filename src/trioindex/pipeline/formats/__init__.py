"""Format detection and text extraction: uploaded bytes in, normalised text out.

The pure, synchronous first half of the parse step: deciding what a file is, decoding it, and
pulling out its text. Every problem with the bytes themselves — unsupported format, undecodable
bytes, a corrupt or scanned PDF, a corrupt package, an empty document, a file over a limit —
is a :class:`~trioindex.errors.ContentInvalid` with a short message that never quotes the
content; nothing else escapes :func:`extract_text` for any input bytes (third-party parsers raise
a zoo of exception types on hostile input; each reader translates them at this boundary).

The functions are CPU-bound: the parse step runs them in a worker process it can kill
(:mod:`trioindex.pipeline.parse_process`). They touch no database, storage or network, and each
format's work is bounded before it starts.

One module per concern:

==============  ====================================================================
``extract``     :func:`extract_text`, the entry point: size check, dispatch, normalise
``detect``      :class:`DocumentFormat`, :func:`detect_format`: content first, name as a hint
``text``        decoding (BOM, declared charset, almost-UTF-8 repair, detection), normalisation
``html``        visible text of HTML, streamed through lxml
``pdf``         pypdf, with the content budget checked page by page
``docx``        python-docx, after the ZIP's inflation is capped
``pptx``        slides: titles as headings, text frames, tables, notes
``xlsx``        sheets: names as headings, rows as lines, streamed
``odf``         OpenDocument text, spreadsheets and presentations, streamed
``epub``        the spine's XHTML documents, read as HTML
``hwpx``        Hangul's OWPML sections, streamed
``hwp``         Hangul 5.0 (OLE2) body text records
``rtf``         RTF: text of the body, code pages and Unicode escapes
``eml``         e-mail: headers, text and HTML parts, attachments' names
``ocr``         scanned PDFs and images through Tesseract, Korean and English
``compressed``  gzip, inflated in blocks up to its cap, then read as the document inside
``package``     ZIP packages under the zip-bomb bounds, XML without entities, depth bounded
``flow``        paragraphs, tables and notes of streamed XML into an outline
``ooxml``       Office Open XML relationship parts (PPTX, XLSX)
``outline``     how structured formats write text: headings, paragraphs, lines, one bound
``limits``      every bound on one document's work (README "Limits on one document")
``messages``    how a refusal names sizes and parser failures
==============  ====================================================================
"""

from trioindex.pipeline.formats.detect import DocumentFormat, detect_format
from trioindex.pipeline.formats.extract import ExtractedText, extract_text
from trioindex.pipeline.formats.limits import PDF_MAX_PAGES
from trioindex.pipeline.formats.ocr import DEFAULT_OCR, OcrPolicy

# What the parse step, the tests and the benchmarks import; the rest stays in its module.
__all__ = [
    "DEFAULT_OCR",
    "PDF_MAX_PAGES",
    "DocumentFormat",
    "ExtractedText",
    "OcrPolicy",
    "detect_format",
    "extract_text",
]
