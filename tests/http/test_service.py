"""``trioindex serve`` as a process, through httpx: every endpoint, every role, the JSON error
shape with its stable codes, hostile parameters (one error each, the service goes on), and
searches in every mode and filter over documents a real worker indexed."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.documents import TOPICS, document_bytes, paragraph
from testkit.embed_server import FakeEmbedServer
from testkit.processes import cli, query, stop_process
from tests.http.conftest import Running, service_env, start
from trioindex.http.app import ENDPOINTS

pytestmark = pytest.mark.slow

ANY_UUID = "00000000-0000-4000-8000-000000000000"
# (method, path) of every route, with a path that routes to it
ROUTES = [
    ("POST", "/v1/documents/a.txt"),
    ("POST", "/v1/documents"),
    ("DELETE", "/v1/documents/a.txt"),
    ("GET", "/v1/documents"),
    ("GET", "/v1/documents/a.txt"),
    ("GET", "/v1/search?q=x"),
    ("POST", "/v1/search"),
    ("GET", "/v1/jobs"),
    ("GET", f"/v1/jobs/{ANY_UUID}"),
    ("POST", f"/v1/jobs/{ANY_UUID}/retry"),
    ("POST", "/v1/jobs/retry-failed"),
    ("GET", "/v1/status"),
    ("GET", "/v1/workers"),
    ("GET", "/v1/activity"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
]
WRITE = {
    ("POST", "/v1/documents/a.txt"),
    ("POST", "/v1/documents"),
    ("DELETE", "/v1/documents/a.txt"),
}
ADMIN = {("POST", f"/v1/jobs/{ANY_UUID}/retry"), ("POST", "/v1/jobs/retry-failed")}


def error(response: httpx.Response) -> tuple[int, str]:
    """Status and code of an error answer, checking its shape: JSON, no stack trace."""
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    assert "Traceback" not in response.text and 'File "' not in response.text
    return response.status_code, body["error"]["code"]


def test_the_route_list_covers_every_endpoint() -> None:
    # + /healthz, the webhook and the console's six (own tests: test_webhook, test_console_api)
    assert len(ROUTES) + 2 + 6 == len(ENDPOINTS)


def test_no_key_is_401_and_each_role_gets_what_it_may(service: Running) -> None:
    tokens = {role: service.key(f"{role}-key", role) for role in ("read", "write", "admin")}
    with service.client() as anonymous:
        assert anonymous.get("/healthz").json() == {"status": "ok"}
        for method, path in ROUTES:
            answer = anonymous.request(method, path)
            assert error(answer) == (401, "unauthenticated"), (method, path)
            assert answer.headers["www-authenticate"] == "Bearer"
        for header in (
            "Basic dXNlcjpwdw==",
            "Bearer",
            "Bearer ti_not-a-key",
            "Bearer " + "x" * 5000,
        ):
            answer = anonymous.get("/v1/status", headers={"Authorization": header})
            assert error(answer) == (401, "unauthenticated"), header
    for role, token in tokens.items():
        with service.client(token) as client:
            for method, path in ROUTES:
                answer = client.request(method, path)
                needed = (
                    "admin"
                    if (method, path) in ADMIN
                    else "write"
                    if (method, path) in WRITE
                    else "read"
                )
                allowed = ["read", "write", "admin"].index(role) >= [
                    "read",
                    "write",
                    "admin",
                ].index(needed)
                if allowed:
                    assert answer.status_code not in (401, 403), (role, method, path, answer.text)
                else:
                    assert error(answer) == (403, "forbidden"), (role, method, path)
    assert tokens["admin"] not in service.log_text()


def key_checks(client: httpx.Client) -> dict[str, float]:
    """The service's count of API-key checks by where the key was found (cache, database)."""
    found = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("trioindex_http_api_key_checks_total{"):
            labels, value = line.rsplit(" ", 1)
            found[labels.split('source="')[1].split('"')[0]] = float(value)
    return found


def test_a_revoked_key_stops_working_at_once(service: Running) -> None:
    token = service.key("page", "read")
    other = service.key("other", "read")
    with service.client(token) as client, service.client(other) as bystander:
        assert client.get("/v1/status").status_code == 200
        assert bystander.get("/v1/status").status_code == 200
        before = key_checks(client)
        for _ in range(3):  # verified already: kept, not read again
            assert client.get("/v1/status").status_code == 200
        after = key_checks(client)
        assert after["cache"] >= before.get("cache", 0) + 4, (before, after)
        assert after["database"] == before["database"], (before, after)
        revoked = cli(service.env, "keys", "revoke", "page")
        assert revoked.returncode == 0, revoked.stderr
        assert error(client.get("/v1/status")) == (401, "unauthenticated")
        assert "revoked" in client.get("/v1/status").json()["error"]["message"]
        # the revocation dropped its own key only
        assert bystander.get("/v1/status").status_code == 200


def test_keys_commands_create_list_and_never_show_a_hash(service: Running) -> None:
    created = cli(service.env, "keys", "create", "uploader", "--role", "write")
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert "shown only now" in created.stderr
    listed = cli(service.env, "keys", "list", "--json")
    (key,) = json.loads(listed.stdout)
    assert (key["name"], key["role"], key["revoked_at"]) == ("uploader", "write", None)
    assert token not in listed.stdout and "hash" not in listed.stdout
    again = cli(service.env, "keys", "create", "uploader")
    assert again.returncode == 1 and "exists" in again.stderr
    bad_role = cli(service.env, "keys", "create", "x", "--role", "root")
    assert bad_role.returncode == 2 and "--role" in bad_role.stderr
    with service.client(token) as client:
        assert client.post("/v1/documents/k.txt", content=b"hello").status_code == 201


def test_upload_list_show_and_delete(service: Running) -> None:
    token = service.key("writer", "write")
    with service.client(token) as client:
        created = client.post(
            "/v1/documents/notes/queue.md",
            content=b"# Queue\nworkers share a queue\n",
            params={"priority": "7"},
        )
        assert created.status_code == 201, created.text
        body = created.json()
        assert (body["status"], body["change"], body["version_no"]) == ("created", "added", 1)
        assert len(body["sha256"]) == 64 and body["byte_size"] == 30
        again = client.post(
            "/v1/documents/notes/queue.md", content=b"# Queue\nworkers share a queue\n"
        )
        assert (again.status_code, again.json()["status"]) == (200, "unchanged")
        changed = client.post(
            "/v1/documents/notes/queue.md",
            content=b"<p>changed</p>",
            headers={"Content-Type": "text/html; charset=utf-8"},
        )
        assert (changed.json()["change"], changed.json()["version_no"]) == ("changed", 2)
        client.post("/v1/documents/other/b.txt", content=b"b")

        listed = client.get("/v1/documents", params={"prefix": "notes/"}).json()
        (doc,) = listed["documents"]
        assert (doc["key"], doc["version_count"], listed["next_after"]) == (
            "notes/queue.md",
            2,
            None,
        )
        latest = doc["latest"]
        assert (latest["version_no"], latest["content_type"]) == (2, "text/html")
        (state,) = latest["models"]
        assert (state["model"], state["serves_search"], state["job_status"]) == (
            "BAAI/bge-m3",
            True,
            "PENDING",
        )
        page = client.get("/v1/documents", params={"limit": "1"}).json()
        assert [d["key"] for d in page["documents"]] == ["notes/queue.md"]
        assert page["next_after"] == "notes/queue.md"
        rest = client.get("/v1/documents", params={"after": page["next_after"]}).json()
        assert [d["key"] for d in rest["documents"]] == ["other/b.txt"]

        shown = client.get("/v1/documents/notes/queue.md").json()
        assert [v["version_no"] for v in shown["versions"]] == [1, 2]
        assert shown["versions"][0]["content_type"] == "text/markdown"
        assert shown["versions"][0]["original_name"] == "queue.md"
        jobs = query(
            service.database_url, "SELECT priority FROM embedding_jobs ORDER BY created_at"
        )
        assert jobs[0]["priority"] == 7

        assert client.delete("/v1/documents/notes/queue.md").json()["deleted"] == "notes/queue.md"
        assert error(client.get("/v1/documents/notes/queue.md")) == (404, "not_found")
        assert error(client.delete("/v1/documents/notes/queue.md")) == (404, "not_found")


HOSTILE: list[tuple[str, str, dict[str, Any], tuple[int, str]]] = [
    ("GET", "/v1/search", {"params": {"q": ""}}, (400, "invalid_request")),
    ("GET", "/v1/search", {"params": {"q": "x" * 4097}}, (400, "invalid_request")),
    # past the search layer's own bounds: 65 distinct terms
    (
        "GET",
        "/v1/search",
        {"params": {"q": " ".join(f"term{i}x" for i in range(65)), "mode": "text"}},
        (400, "query_refused"),
    ),
    ("GET", "/v1/search", {"params": {"q": "a\x00b"}}, (400, "invalid_request")),
    ("GET", "/v1/search", {"params": {"q": "x", "top_k": "0"}}, (400, "invalid_request")),
    ("GET", "/v1/search", {"params": {"q": "x", "top_k": "1001"}}, (400, "invalid_request")),
    ("GET", "/v1/search", {"params": {"q": "x", "top_k": "9" * 40}}, (400, "invalid_request")),
    ("GET", "/v1/search", {"params": {"q": "x", "mode": "fuzzy"}}, (400, "invalid_request")),
    ("GET", "/v1/search", {"params": {"q": "x", "chunks": "maybe"}}, (400, "invalid_request")),
    (
        "GET",
        "/v1/search",
        {"params": {"q": "x", "chunks_per_document": "101"}},
        (400, "invalid_request"),
    ),
    ("POST", "/v1/search", {"content": b"{not json"}, (400, "invalid_request")),
    ("POST", "/v1/search", {"json": {"queries": []}}, (400, "invalid_request")),
    ("POST", "/v1/search", {"json": {"queries": ["x"] * 65}}, (400, "invalid_request")),
    ("POST", "/v1/search", {"json": {"queries": [{"id": 1, "text": 5}]}}, (400, "invalid_request")),
    ("POST", "/v1/search", {"json": ["x"]}, (400, "invalid_request")),
    ("POST", "/v1/search", {"content": b"[" * 2_000_000}, (413, "body_too_large")),
    ("GET", "/v1/jobs", {"params": {"status": "DONE"}}, (400, "invalid_request")),
    ("GET", "/v1/jobs", {"params": {"limit": "-1"}}, (400, "invalid_request")),
    ("GET", "/v1/jobs/not-a-uuid", {}, (400, "invalid_request")),
    ("GET", f"/v1/jobs/{ANY_UUID}", {}, (404, "not_found")),
    ("POST", f"/v1/jobs/{ANY_UUID}/retry", {}, (404, "not_found")),
    ("GET", "/v1/documents", {"params": {"limit": "1001"}}, (400, "invalid_request")),
    ("GET", "/v1/documents/", {}, (400, "invalid_request")),
    ("POST", "/v1/documents/" + "k" * 1025, {"content": b"x"}, (400, "invalid_request")),
    (
        "POST",
        "/v1/documents/a.txt",
        {"content": b"x", "params": {"priority": str(2**31)}},
        (400, "invalid_request"),
    ),
    ("PUT", "/v1/documents/a.txt", {}, (405, "method_not_allowed")),
    ("GET", "/v2/anything", {}, (404, "not_found")),
]


def test_hostile_requests_get_one_json_error_each_and_the_service_goes_on(service: Running) -> None:
    token = service.key("admin", "admin")
    with service.client(token) as client:
        for method, path, kwargs, expected in HOSTILE:
            assert error(client.request(method, path, **kwargs)) == expected, (method, path, kwargs)
        assert client.get("/v1/status").status_code == 200
        client.post("/v1/documents/a.txt", content=b"a")
        (job,) = client.get("/v1/jobs").json()["jobs"]
        assert error(client.post(f"/v1/jobs/{job['id']}/retry")) == (409, "job_not_failed")
        # a job that failed for good goes back to the queue with a fresh budget
        query(
            service.database_url,
            """UPDATE embedding_jobs SET status = 'FAILED', finished_at = now(),
                      last_failure_type = 'STORAGE_UNAVAILABLE', last_failure_message = 'gone'""",
        )
        assert (
            client.get("/v1/jobs", params={"status": "FAILED"}).json()["jobs"][0]["id"] == job["id"]
        )
        retried = client.post(f"/v1/jobs/{job['id']}/retry")
        assert (retried.status_code, retried.json()["status"]) == (200, "PENDING")
        assert client.get(f"/v1/jobs/{job['id']}").json()["status"] == "PENDING"
    assert "Traceback" not in service.log_text()


def test_status_metrics_and_openapi(service: Running) -> None:
    token = service.key("reader", "read")
    with service.client(token) as client:
        status = client.get("/v1/status").json()
        assert status["serving_model"] == "BAAI/bge-m3"
        assert status["models"][0]["name"] == "BAAI/bge-m3"
        assert set(status["jobs_by_status"]) == {"PENDING", "PROCESSING", "SUCCEEDED", "FAILED"}
        spec = client.get("/openapi.json").json()
        assert spec["openapi"].startswith("3.")
        described = {(m.upper(), p) for p, ops in spec["paths"].items() for m in ops}
        assert described == {(e.method, e.path.replace(":path}", "}")) for e in ENDPOINTS}
        assert spec["paths"]["/healthz"]["get"]["security"] == []
        assert spec["paths"]["/v1/jobs/{id}/retry"]["post"]["x-trioindex-role"] == "admin"
        metrics = client.get("/metrics")
        assert metrics.headers["content-type"].startswith("text/plain")
        assert (
            'trioindex_http_requests_total{method="GET",route="/v1/status",status="200"}'
            in metrics.text
        )
        assert "/openapi.json" in metrics.text


def _corpus() -> dict[str, tuple[bytes, str]]:
    docs = {}
    for topic, sentence in TOPICS[:4]:
        text = [paragraph(topic, sentence, 6) for _ in range(2)]
        docs[f"papers/{topic}.md"] = (document_bytes("md", topic, text), "text/markdown")
        docs[f"web/{topic}.html"] = (document_bytes("html", topic, text), "text/html")
    return docs


def test_searches_in_every_mode_and_filter_over_what_a_worker_indexed(service: Running) -> None:
    token = service.key("app", "write")
    with service.client(token) as client:
        for key, (data, content_type) in _corpus().items():
            answer = client.post(
                f"/v1/documents/{key}", content=data, headers={"Content-Type": content_type}
            )
            assert answer.status_code == 201, answer.text
        drained = cli(service.env, "worker", "--drain", timeout=300)
        assert drained.returncode == 0, drained.stderr[-2000:]
        for mode in ("text", "vector", "hybrid"):
            found = client.get(
                "/v1/search", params={"q": "marker-postgres-1 SKIP LOCKED", "mode": mode}
            )
            assert found.status_code == 200, found.text
            results = found.json()["results"]
            assert results, mode
            assert {"rank", "score", "document_key", "version_no", "content_type", "chunks"} <= set(
                results[0]
            )
            assert results[0]["chunks"][0]["snippet"]
            if mode == "text":
                assert "postgres" in results[0]["document_key"], (mode, results[0])
            elif mode == "hybrid":  # the fake vectors carry no meaning: the text match fused in
                top = [r["document_key"] for r in results[:3]]
                assert any("postgres" in key for key in top), (mode, top)
        only_papers = client.get(
            "/v1/search",
            params={"q": "workers", "mode": "text", "prefix": "papers/", "top_k": "10"},
        )
        assert {r["document_key"].split("/")[0] for r in only_papers.json()["results"]} == {
            "papers"
        }
        html = client.get(
            "/v1/search", params=[("q", "workers"), ("mode", "text"), ("content_type", "text/html")]
        )
        assert {r["content_type"] for r in html.json()["results"]} == {"text/html"}
        chunks = client.get(
            "/v1/search", params={"q": "lease", "mode": "text", "chunks": "true", "top_k": "3"}
        )
        hits = chunks.json()["results"]
        assert 1 <= len(hits) <= 3 and {"chunk_index", "text"} <= set(hits[0])
        many = client.post(
            "/v1/search",
            json={
                "queries": [
                    {"id": "q1", "text": "structured concurrency nurseries"},
                    "cosine distance pgvector",
                ],
                "mode": "hybrid",
                "top_k": 2,
                "chunks_per_document": 1,
                "content_types": ["text"],
            },
        )
        assert many.status_code == 200, many.text
        first, second = many.json()["results"]
        assert (first["id"], second["id"]) == ("q1", 1)
        assert "trio" in first["results"][0]["document_key"]
        assert all(len(r["chunks"]) == 1 for r in first["results"]) and len(first["results"]) <= 2
        assert "vectors" in second["results"][0]["document_key"]
        assert {r["content_type"].split("/")[0] for r in second["results"]} == {"text"}
        docs = client.get("/v1/documents", params={"prefix": "papers/"}).json()["documents"]
        assert {d["latest"]["models"][0]["job_status"] for d in docs} == {"SUCCEEDED"}
        assert {d["latest"]["models"][0]["served_version_no"] for d in docs} == {1}


def test_no_auth_answers_without_keys_on_loopback_and_refuses_other_hosts(
    database_url: str, s3_url: str, tmp_path: Path, embed_server: FakeEmbedServer
) -> None:
    env = service_env(database_url, s3_url, tmp_path / "home", embed_server)
    for host in ("0.0.0.0", "db.example", "10.1.2.3"):
        refused = cli(env, "serve", "--no-auth", "--host", host, "--port", "1")
        assert refused.returncode == 2 and "loopback only" in refused.stderr, host
    url, process = start(env, tmp_path / "serve.log", "--no-auth")
    try:
        assert (
            httpx.post(f"{url}/v1/documents/open.txt", content=b"no key needed").status_code == 201
        )
        assert httpx.get(f"{url}/v1/jobs").json()["jobs"][0]["document_key"] == "open.txt"
    finally:
        stop_process(process)
    assert "NO authentication" in (tmp_path / "serve.log").read_text()


def test_one_kept_alive_connection_carries_uploads_errors_and_reads(service: Running) -> None:
    token = service.key("keeper", "write")
    headers = {"Authorization": f"Bearer {token}"}
    where = httpx.URL(service.url)
    connection = http.client.HTTPConnection(where.host, where.port, timeout=60)
    try:
        connection.connect()
        sock = connection.sock
        answers = []
        for i in range(5):
            connection.request("POST", f"/v1/documents/alive/{i}.txt", f"kept {i}", headers)
            answers.append(connection.getresponse())
            answers[-1].read()
        connection.request("GET", "/v1/nowhere", headers=headers)  # an error without a body
        answers.append(connection.getresponse())
        answers[-1].read()
        connection.request("GET", "/v1/documents?prefix=alive/", headers=headers)
        listed = connection.getresponse()
        keys = [d["key"] for d in json.loads(listed.read())["documents"]]
        assert connection.sock is sock  # every request on the first connection
    finally:
        connection.close()
    assert [a.status for a in answers] == [201] * 5 + [404]
    assert all(a.getheader("connection") != "close" for a in answers)
    assert keys == [f"alive/{i}.txt" for i in range(5)]
