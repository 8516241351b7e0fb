"""What the console needs from the service, over httpx against ``trioindex serve`` as a process:
the session (cookie attributes, CSRF on every action, revocation, sign-out, hostile sign-ins),
the jobs filters and paging, a job's events, the activity buckets, the workers and the retry of
every failed job of a type; and the session store's bounds with a fake clock."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import httpx
import pytest

from testkit.embed_server import FakeEmbedServer
from testkit.processes import REPO_ROOT, cli, query
from tests.http.conftest import Running
from trioindex.http import openapi, session
from trioindex.http.app import ENDPOINTS
from trioindex.http.console import ASSETS
from trioindex.http.session import COOKIE, SessionStore

ORIGIN_HEADERS = {"Content-Type": "application/json"}


def code(answer: httpx.Response) -> tuple[int, str]:
    return answer.status_code, answer.json()["error"]["code"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_sessions_end_when_idle_or_old_and_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    store = SessionStore(clock=clock)
    first, opened = store.open("token-1")
    assert store.find(first) is opened and opened.token == "token-1"
    clock.now += session.IDLE_SECONDS - 1
    assert store.find(first) is opened  # used: the idle time starts again
    clock.now += session.IDLE_SECONDS + 1
    assert store.find(first) is None and first not in store.sessions
    busy, _ = store.open("token-2")
    for _ in range(int(session.MAX_AGE_SECONDS // (session.IDLE_SECONDS / 2))):
        clock.now += session.IDLE_SECONDS / 2
        assert store.find(busy) is not None
    clock.now += 1
    assert store.find(busy) is None  # never idle, but older than the maximum age
    assert store.find(None) is None and store.find("not-a-session") is None
    monkeypatch.setattr(session, "MAX_SESSIONS", 3)
    ids = [store.open(f"t{i}")[0] for i in range(4)]
    assert list(store.sessions) == ids[1:]  # the least recently used went first
    store.close(ids[1])
    assert ids[1] not in store.sessions
    assert "t2" not in repr(store) and "t2" not in repr(store.sessions[ids[2]])


def test_every_route_has_its_own_openapi_operation_id() -> None:
    described = openapi.document(ENDPOINTS, "0")["paths"]
    ids = [operation["operationId"] for path in described.values() for operation in path.values()]
    assert len(ids) == len(ENDPOINTS) and len(set(ids)) == len(ids)
    assert described["/console/session"]["post"]["security"] == []  # the key is in the body


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("uv") is None, reason="builds the wheel with uv")
def test_the_wheel_ships_every_console_file(tmp_path: Path) -> None:
    built = subprocess.run(
        ["uv", "build", "--wheel", "--out-dir", str(tmp_path), str(REPO_ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"trioindex/http/console/{name}" for name in ASSETS} <= names


@pytest.mark.slow
def test_a_console_session_stands_for_its_key_until_revoked_or_signed_out(
    service: Running,
) -> None:
    token = service.key("operator", "admin")
    with service.client() as browser:
        for body in (b"{not json", b"[]", b'{"key": 5}', b'{"key": "a", "x": 1}', b'{"key": ""}'):
            answer = browser.post("/console/session", content=body, headers=ORIGIN_HEADERS)
            assert code(answer) == (400, "invalid_request"), body
        assert code(browser.post("/console/session", json={"key": "a\x00b"}))[0] == 400
        assert code(browser.post("/console/session", content=b"{" + b" " * 5000 + b"}")) == (
            413,
            "body_too_large",
        )
        assert code(browser.post("/console/session", json={"key": "ti_nope"})) == (
            401,
            "unauthenticated",
        )
        foreign = browser.post(
            "/console/session", json={"key": token}, headers={"Origin": "https://evil.example"}
        )
        assert code(foreign) == (403, "forbidden") and COOKIE not in browser.cookies
        assert code(browser.get("/console/session")) == (401, "unauthenticated")

        signed = browser.post(
            "/console/session", json={"key": token}, headers={"Origin": service.url}
        )
        assert signed.status_code == 200, signed.text
        who = signed.json()
        assert (who["name"], who["role"], who["auth"]) == ("operator", "admin", True)
        cookie = signed.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
        assert "Secure" not in cookie  # plain HTTP on loopback; Secure over HTTPS
        assert token not in cookie and token not in signed.text
        assert browser.get("/console/session").json()["csrf"] == who["csrf"]

        # reads need the cookie only; every action also needs the session's CSRF token
        assert browser.get("/v1/status").status_code == 200
        retry = "/v1/jobs/retry-failed"
        body = {"failure_type": "STORAGE_UNAVAILABLE"}
        assert code(browser.post(retry, json=body)) == (403, "csrf_failed")
        wrong = browser.post(retry, json=body, headers={"X-CSRF-Token": "x" * 43})
        assert code(wrong) == (403, "csrf_failed")
        done = browser.post(retry, json=body, headers={"X-CSRF-Token": who["csrf"]})
        assert done.json() == {"failure_type": "STORAGE_UNAVAILABLE", "retried": 0, "jobs": []}
        assert code(browser.delete("/console/session")) == (403, "csrf_failed")

        # a second session, signed out: its cookie is refused from then on
        with service.client() as other:
            csrf = other.post("/console/session", json={"key": token}).json()["csrf"]
            ended = other.cookies[COOKIE]
            assert (
                other.delete("/console/session", headers={"X-CSRF-Token": csrf}).status_code == 200
            )
            assert COOKIE not in other.cookies
            stale = httpx.get(f"{service.url}/v1/status", cookies={COOKIE: ended})
            assert code(stale) == (401, "unauthenticated") and "ended" in stale.text

        revoked = cli(service.env, "keys", "revoke", "operator")
        assert revoked.returncode == 0, revoked.stderr
        assert code(browser.get("/v1/status")) == (401, "unauthenticated")
        assert code(browser.get("/console/session")) == (401, "unauthenticated")
        assert browser.get("/healthz").status_code == 200
    assert token not in service.log_text()


@pytest.mark.slow
def test_jobs_filters_events_activity_workers_and_retry_of_a_type(
    service: Running, embed_server: FakeEmbedServer
) -> None:
    admin, writer = service.key("admin", "admin"), service.key("writer", "write")
    with service.client(admin) as client:
        for key in ("a/one.md", "a/two.md", "b/three.md"):
            assert client.post(
                f"/v1/documents/{key}", content=f"# {key}\nfine\n".encode()
            ).is_success
        drained = cli(service.env, "worker", "--drain", timeout=300)
        assert drained.returncode == 0, drained.stderr
        embed_server.set_mode("nan")
        assert client.post("/v1/documents/b/bad.md", content=b"# bad\nnot fine\n").is_success
        drained = cli(service.env, "worker", "--drain", timeout=300)
        assert drained.returncode == 0, drained.stderr
        embed_server.set_mode("normal")

        def jobs(**params: str) -> dict[str, object]:
            answer = client.get("/v1/jobs", params=params)
            assert answer.status_code == 200, answer.text
            return answer.json()  # type: ignore[no-any-return]

        assert jobs()["total"] == 4
        assert jobs(prefix="a/")["total"] == 2
        assert jobs(status="SUCCEEDED", prefix="b/")["total"] == 1
        failed = jobs(status="FAILED", failure_type="EMBEDDING_RESULT_INVALID")
        assert failed["total"] == 1
        (bad,) = failed["jobs"]  # type: ignore[misc]
        assert bad["document_key"] == "b/bad.md"
        assert jobs(model="BAAI/bge-m3")["total"] == 4 and jobs(model="other")["total"] == 0
        assert jobs(since="2999-01-01T00:00:00Z")["total"] == 0
        assert jobs(since="2000-01-01T00:00:00")["total"] == 4  # no zone: UTC
        page = jobs(limit="3", offset="3")
        assert (page["total"], len(page["jobs"]), page["offset"]) == (4, 1, 3)  # type: ignore[arg-type]
        for params in (
            {"status": "NOPE"},
            {"failure_type": "FLAKY"},
            {"since": "yesterday"},
            {"offset": "-1"},
            {"limit": "0"},
            {"prefix": "a\x00"},
            {"model": "x" * 2000},
        ):
            assert code(client.get("/v1/jobs", params=params)) == (400, "invalid_request"), params
        assert jobs()["total"] == 4  # the service goes on

        detail = client.get(f"/v1/jobs/{bad['id']}").json()
        types = [e["event_type"] for e in detail["events"]]
        assert types[0] == "JOB_ENQUEUED" and types[-1] == "JOB_FAILED"
        assert all("token" not in e["detail"] for e in detail["events"])

        hour = client.get("/v1/activity").json()
        assert (hour["window_seconds"], hour["bucket_seconds"], len(hour["buckets"])) == (
            3600,
            60,
            60,
        )
        assert sum(b["documents"] for b in hour["buckets"]) == 3
        assert sum(b["chunks"] for b in hour["buckets"]) >= 3
        failures = [b["failures"] for b in hour["buckets"] if b["failures"]]
        assert failures == [{"EMBEDDING_RESULT_INVALID": 1}]
        day = client.get("/v1/activity", params={"window": "day"}).json()
        assert len(day["buckets"]) == 48 and sum(b["documents"] for b in day["buckets"]) == 3
        assert code(client.get("/v1/activity", params={"window": "week"})) == (
            400,
            "invalid_request",
        )

        (worker, _) = client.get("/v1/workers").json()["workers"]  # two drained workers
        assert worker["state"] == "STOPPED" and worker["jobs"] == []
        assert worker["max_concurrency"] >= 1 and worker["heartbeat_age_seconds"] >= 0

        retry = "/v1/jobs/retry-failed"
        for body in ({}, {"failure_type": 5}, {"failure_type": "NOPE"}, {"failure_type": ""}):
            assert code(client.post(retry, json=body)) == (400, "invalid_request"), body
        with service.client(writer) as lower:
            refused = lower.post(retry, json={"failure_type": "EMBEDDING_RESULT_INVALID"})
            assert code(refused) == (403, "forbidden")
        assert (
            query(
                service.database_url, "SELECT status FROM embedding_jobs WHERE id = %s", bad["id"]
            )[0]["status"]
            == "FAILED"
        )
        done = client.post(retry, json={"failure_type": "EMBEDDING_RESULT_INVALID"}).json()
        assert done == {
            "failure_type": "EMBEDDING_RESULT_INVALID",
            "retried": 1,
            "jobs": [bad["id"]],
        }
        (row,) = query(
            service.database_url, "SELECT status FROM embedding_jobs WHERE id = %s", bad["id"]
        )
        assert row["status"] == "PENDING"
        again = client.post(retry, json={"failure_type": "EMBEDDING_RESULT_INVALID"}).json()
        assert again["retried"] == 0
