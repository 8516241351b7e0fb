"""``GET /v1/documents`` shows each newest version's low-confidence OCR pages and filters on
them (``?low_confidence=``), through ``trioindex serve`` as a process. The pages are set in
the database as the chunk commit sets them (tests/pipeline/test_ocr_review.py indexes a real
scan that way)."""

from __future__ import annotations

import httpx
import psycopg

from tests.http.conftest import Running


def _keys(client: httpx.Client, **params: str) -> list[str]:
    listed = client.get("/v1/documents", params=params)
    assert listed.status_code == 200, listed.text
    return [d["key"] for d in listed.json()["documents"]]


def test_documents_list_shows_and_filters_the_low_confidence_mark(service: Running) -> None:
    with service.client(service.key("writer", "write")) as client:
        for key in ("scan.png", "notes.txt"):
            assert client.post(f"/v1/documents/{key}", content=key.encode()).status_code == 201
        with psycopg.connect(service.database_url, autocommit=True) as conn:
            conn.execute(
                """UPDATE document_versions v SET ocr_low_confidence_pages = '{1,3}'
                   FROM documents d WHERE d.id = v.document_id AND d.external_key = 'scan.png'"""
            )
        documents = client.get("/v1/documents").json()["documents"]
        marks = {d["key"]: d["latest"]["low_confidence_pages"] for d in documents}
        assert marks == {"scan.png": [1, 3], "notes.txt": []}
        assert _keys(client, low_confidence="true") == ["scan.png"]
        assert _keys(client, low_confidence="false") == ["notes.txt"]
        refused = client.get("/v1/documents", params={"low_confidence": "maybe"})
        assert refused.status_code == 400
        assert "low_confidence must be true or false" in refused.text
