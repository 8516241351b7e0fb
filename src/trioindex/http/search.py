"""Search over HTTP: ``GET /v1/search?q=...`` for one query, ``POST /v1/search`` for many, with
every mode and filter of ``trioindex search``: ``mode`` (vector, text, hybrid), ``top_k``,
``prefix``, ``content_type`` (repeatable; a type or a family), ``chunks`` (chunk hits instead
of documents) and ``chunks_per_document``. Results are documents with their best passages
(the ``search --json`` shape), through :class:`trioindex.api.index.Index`'s search functions, whose
model the service loaded once at start.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from trioindex.http.context import service
from trioindex.http.errors import classify, invalid
from trioindex.http.limits import (
    MAX_CHUNKS_PER_DOCUMENT,
    MAX_CONTENT_TYPES,
    MAX_QUERIES,
    MAX_TOP_K,
    bool_param,
    check_text,
    int_param,
    read_json,
)
from trioindex.search import DEFAULT_MODE, SEARCH_MODES, SearchMode
from trioindex.search.query import MAX_QUERY_CHARS


@attrs.frozen
class SearchOptions:
    """The options of one search request, checked."""

    mode: SearchMode
    top_k: int
    prefix: str | None
    content_types: tuple[str, ...]
    chunks: bool
    chunks_per_document: int

    @classmethod
    def parse(
        cls,
        *,
        mode: object,
        top_k: object,
        prefix: object,
        content_types: Sequence[object],
        chunks: object,
        chunks_per_document: object,
    ) -> SearchOptions:
        if mode is None:
            mode = DEFAULT_MODE
        if mode not in SEARCH_MODES:
            raise invalid(f"mode must be one of {', '.join(SEARCH_MODES)}")
        if len(content_types) > MAX_CONTENT_TYPES:
            raise invalid(f"at most {MAX_CONTENT_TYPES} content types")
        return cls(
            mode=mode,  # checked against SEARCH_MODES
            top_k=int_param(top_k, "top_k", default=5, low=1, high=MAX_TOP_K),
            prefix=None if prefix in (None, "") else check_text("prefix", prefix),
            content_types=tuple(check_text("content_type", t, 255) for t in content_types),
            chunks=bool_param(chunks, "chunks"),
            chunks_per_document=int_param(
                chunks_per_document,
                "chunks_per_document",
                default=3,
                low=1,
                high=MAX_CHUNKS_PER_DOCUMENT,
            ),
        )


def _query(text: object, name: str = "q") -> str:
    return check_text(name, text, MAX_QUERY_CHARS)


async def _answers(request: Request, queries: list[str], options: SearchOptions) -> list[Any]:
    """One answer per query: its hits as JSON, or the error that query got."""
    index = service(request).index
    common: dict[str, Any] = {
        "top_k": options.top_k,
        "mode": options.mode,
        "key_prefix": options.prefix,
        "content_types": options.content_types,
    }
    ranked: Sequence[Any]
    if options.chunks:
        ranked = await index.search_chunks_many(queries, **common)
    else:
        ranked = await index.search_many(
            queries, chunks_per_document=options.chunks_per_document, **common
        )
    return [_answer(hits) for hits in ranked]


def _answer(hits: Any) -> Any:
    # a query the index refused alone comes back in its place as an error value
    if isinstance(hits, Exception):
        error = classify(hits)
        if error is None:
            raise hits
        return {"error": {"code": error.code, "message": error.message}}
    return [hit.as_json() for hit in hits]


async def search_one(request: Request) -> Response:
    params = request.query_params
    query = _query(params.get("q"))
    options = SearchOptions.parse(
        mode=params.get("mode"),
        top_k=params.get("top_k"),
        prefix=params.get("prefix"),
        content_types=params.getlist("content_type"),
        chunks=params.get("chunks"),
        chunks_per_document=params.get("chunks_per_document"),
    )
    (answer,) = await _answers(request, [query], options)
    if isinstance(answer, dict):
        error = answer["error"]
        return JSONResponse({"error": error}, status_code=400)
    return JSONResponse({"query": query, "mode": options.mode, "results": answer})


async def search_many(request: Request) -> Response:
    body = await read_json(request)
    if not isinstance(body, dict) or not isinstance(body.get("queries"), list):
        raise invalid('the body must be {"queries": [...], ...options}')
    raw = body["queries"]
    if not 1 <= len(raw) <= MAX_QUERIES:
        raise invalid(f"give 1 to {MAX_QUERIES} queries")
    ids: list[Any] = []
    texts: list[str] = []
    for i, item in enumerate(raw):
        if isinstance(item, dict):
            ids.append(item.get("id", i))
            texts.append(_query(item.get("text"), f"queries[{i}].text"))
        else:
            ids.append(i)
            texts.append(_query(item, f"queries[{i}]"))
    content_types = body.get("content_types") or []
    if not isinstance(content_types, list):
        raise invalid("content_types must be a list")
    options = SearchOptions.parse(
        mode=body.get("mode"),
        top_k=body.get("top_k"),
        prefix=body.get("prefix"),
        content_types=content_types,
        chunks=body.get("chunks"),
        chunks_per_document=body.get("chunks_per_document"),
    )
    answers = await _answers(request, texts, options)
    results = [
        {"id": query_id, **(answer if isinstance(answer, dict) else {"results": answer})}
        for query_id, answer in zip(ids, answers, strict=True)
    ]
    return JSONResponse({"mode": options.mode, "results": results})
