"""The web console in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``) driven through Selenium, against ``trioindex serve`` as a process, a real
worker process, the embedded PostgreSQL, a real S3 server and the fake embedding server.

One service, one worker and one browser for the whole module (started once: they cost seconds);
each test signs in, uploads the documents it looks at under a key prefix of its own and counts
only those (or what it added), so any test passes alone and in any order. Every URL the page
requested is read from Chromium's performance log, and the last test checks that none left the
service's origin. Screenshots of
every page at 1280x800 and at a phone's width are written to ``$TRIOINDEX_SCREENSHOTS`` (e.g.
``docs/console``) when it is set, else to a temporary folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import httpx
import pytest

from testkit.embed_server import FakeEmbedServer
from testkit.postgres import fresh_database
from testkit.processes import query, spawn, stop_process, wait_for
from tests.fixtures.s3 import S3Server
from tests.http.conftest import Running, service_env, start

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import (  # noqa: E402
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None or DRIVER is None,
        reason="needs Debian's chromium and chromium-driver (`just setup-browser`, as root)",
    ),
]

WAIT = 60.0
DESKTOP = (1280, 800)
PHONE = (390, 844)
TOPIC = b"# Harbour ledger\n\nThe lighthouse keeper logs every tide in the harbour ledger.\n"


@attrs.define
class Console:
    """The module's service, worker, browser and what the browser requested so far."""

    service: Running
    embed: FakeEmbedServer
    browser: WebDriver
    tokens: dict[str, str]
    shots: Path
    requested: list[str] = attrs.field(factory=list)
    worker: subprocess.Popen[bytes] | None = None

    def open(self, hash_path: str) -> None:
        self.browser.get(f"{self.service.url}/console/#/{hash_path}")

    def find(self, css: str) -> Any:
        return self.browser.find_element(By.CSS_SELECTOR, css)

    def until(self, check: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
        def attempt(_: WebDriver) -> Any:
            try:
                return check()
            except (StaleElementReferenceException, LookupError, ValueError):
                return False
            except Exception as exc:  # an element not there yet
                if type(exc).__name__ == "NoSuchElementException":
                    return False
                raise

        try:
            return WebDriverWait(self.browser, timeout, poll_frequency=0.1).until(attempt)
        except TimeoutException:
            raise AssertionError(f"timed out waiting for {what}") from None

    def text(self, css: str) -> str:
        return str(self.find(css).text)

    def sign_in(self, role: str) -> None:
        self.signed_out()
        field = self.find("#api-key")
        field.clear()
        field.send_keys(self.tokens[role])
        self.find("#sign-in-button").click()
        self.until(lambda: f"· {role}" in self.text("#who-name"), f"signed in as {role}")

    def sign_out(self) -> None:
        self.find("#sign-out").click()
        self.until(lambda: self.find("#api-key"), "the sign-in form after signing out")

    def confirm(self) -> None:
        self.until(lambda: self.find("#confirm").get_attribute("open") is not None, "the dialog")
        self.find("#confirm-ok").click()

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        with self.service.client(self.tokens["admin"]) as client:
            return client.request(method, path, **kwargs)

    def upload(self, key: str, body: bytes) -> None:
        answer = self.api("POST", f"/v1/documents/{key}", content=body)
        assert answer.status_code in (200, 201), answer.text

    def screenshot(self, name: str) -> None:
        """The page at desktop and phone size (back to desktop after)."""
        for (width, height), suffix in ((DESKTOP, ""), (PHONE, "-phone")):
            self.viewport(width, height, mobile=suffix != "")
            self.browser.execute_script("window.scrollTo(0, 0)")
            self.browser.save_screenshot(str(self.shots / f"{name}{suffix}.png"))
        self.viewport(*DESKTOP)

    def viewport(self, width: int, height: int, *, mobile: bool = False) -> None:
        self.browser.execute_cdp_cmd(  # type: ignore[attr-defined]
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
        )

    def drain_log(self) -> None:
        for entry in self.browser.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message["method"] == "Network.requestWillBeSent":
                self.requested.append(message["params"]["request"]["url"])

    def start_worker(self) -> None:
        if self.worker is None:
            log = self.service.log.with_name("w.log")
            self.worker = spawn(self.service.env, "worker", log=log)

    def stop_worker(self) -> None:
        if self.worker is not None:
            stop_process(self.worker)
            self.worker = None

    def signed_out(self) -> None:
        """The browser without a session, on the console's sign-in form."""
        self.browser.delete_all_cookies()
        self.browser.get(f"{self.service.url}/console")  # redirects to /console/
        self.until(lambda: self.find("#api-key"), "the sign-in form")

    def count(self, status: str) -> int:
        """The overview's count of jobs in ``status`` (the overview is open)."""
        return int(self.text(f"#count-{status} .n"))

    def indexed(self, key: str, body: bytes) -> None:
        """``key`` uploaded and indexed (the worker runs)."""
        self.upload(key, body)
        wait_for(lambda: self.job(key)["status"] == "SUCCEEDED", WAIT, f"{key} indexed")

    def failed(self, key: str, body: bytes) -> str:
        """``key`` uploaded while the embedding server answers NaN: its failed job's id."""
        self.embed.set_mode("nan")  # an invalid embedding: EMBEDDING_RESULT_INVALID, not retried
        try:
            self.upload(key, body)
            wait_for(lambda: self.job(key)["status"] == "FAILED", WAIT, f"{key} failed")
        finally:
            self.embed.set_mode("normal")
        return str(self.job(key)["id"])

    def job(self, key: str) -> dict[str, Any]:
        (row,) = query(
            self.service.database_url,
            """SELECT j.id, j.status FROM embedding_jobs j
               JOIN document_versions v ON v.id = j.document_version_id
               JOIN documents d ON d.id = v.document_id
               WHERE d.external_key = %s ORDER BY v.version_no DESC LIMIT 1""",
            key,
        )
        return row


def _browser() -> WebDriver:
    from selenium.webdriver.chrome.service import Service as DriverService

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",  # root in a container
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--disable-default-apps",
        "--hide-scrollbars",
        f"--window-size={DESKTOP[0]},{DESKTOP[1]}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    return webdriver.Chrome(service=DriverService(executable_path=str(DRIVER)), options=options)


@pytest.fixture(scope="module")
def console(pg_server_url: str, template_database: str, s3_server: S3Server) -> Iterator[Console]:
    shots_env = os.environ.get("TRIOINDEX_SCREENSHOTS")
    with (
        tempfile.TemporaryDirectory(prefix="trioindex-console-") as scratch,
        fresh_database(pg_server_url, "trioindex_console", template_database) as database_url,
        FakeEmbedServer() as embed,
    ):
        shots = Path(shots_env) if shots_env else Path(scratch) / "shots"
        shots.mkdir(parents=True, exist_ok=True)
        bucket = "console-" + os.urandom(6).hex()
        s3_server.client().make_bucket(bucket)
        env = service_env(database_url, s3_server.url(bucket), Path(scratch) / "home", embed)
        log = Path(scratch) / "serve.log"
        url, process = start(env, log)
        service = Running(url, process, log, env, database_url, bucket)
        tokens = {role: service.key(f"{role}-key", role) for role in ("read", "write", "admin")}
        browser = _browser()
        found = Console(service, embed, browser, tokens, shots)
        found.viewport(*DESKTOP)
        try:
            yield found
        finally:
            browser.quit()
            if found.worker is not None:
                stop_process(found.worker)
            stop_process(process)
        logged = log.read_text(errors="replace")
        assert not any(token in logged for token in tokens.values())


@pytest.fixture
def admin(console: Console) -> Console:
    """The console signed in as admin, its worker running, the embedding server answering."""
    console.embed.set_mode("normal")
    console.start_worker()
    console.sign_in("admin")
    return console


def test_sign_in_and_the_overview_changes_while_a_worker_indexes(console: Console) -> None:
    console.stop_worker()  # the uploads below stay pending until it starts
    console.embed.set_mode("normal")
    console.signed_out()
    assert not console.find("#nav").is_displayed() and not console.find("#who").is_displayed()
    console.screenshot("sign-in")
    console.find("#api-key").send_keys("ti_" + "0" * 32 + "_" + "x" * 43)
    console.find("#sign-in-button").click()
    console.until(lambda: "unknown API key" in console.text("#sign-in-error"), "the refusal")

    console.sign_in("admin")
    cookie = console.browser.get_cookie("trioindex_session")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert console.browser.execute_script("return document.cookie") == ""
    console.until(lambda: console.text("#count-SUCCEEDED .n").isdigit(), "the overview's counts")
    succeeded, pending = console.count("SUCCEEDED"), console.count("PENDING")

    for i in range(6):
        console.upload(f"notes/tide-{i}.md", TOPIC + f"Entry {i}: calm water.\n".encode())
    console.until(lambda: console.count("PENDING") == pending + 6, "six pending jobs, live")
    assert console.text("#oldest-pending") != "—"
    console.start_worker()
    console.until(lambda: console.count("SUCCEEDED") == succeeded + 6, "six indexed, live")
    assert console.count("PENDING") == pending
    # the documents chart has a bar now (a rect per non-empty bucket)
    console.until(
        lambda: console.browser.find_elements(By.CSS_SELECTOR, "#charts .panel:first-child rect"),
        "a bar in the documents chart",
    )
    page = console.browser.page_source
    assert not any(token in page for token in console.tokens.values())
    assert not any(token in console.browser.current_url for token in console.tokens.values())
    console.drain_log()


def test_filter_jobs_open_a_failed_one_and_retry_it_as_admin(admin: Console) -> None:
    console = admin
    console.indexed("inbox/fine.md", b"# Fine\n\nThis one is embedded.\n")
    failed = console.failed("inbox/broken.md", b"# Broken\n\nThis one meets a bad embedding.\n")

    console.open("jobs?prefix=inbox/")
    console.until(lambda: "of 2 jobs" in console.text("#jobs-count"), "the folder's two jobs")
    Select(console.find("#filter-status")).select_by_value("FAILED")  # submits on change
    console.until(lambda: "of 1 job" in console.text("#jobs-count"), "only the failed job")
    assert "status=FAILED" in console.browser.current_url
    rows = console.browser.find_elements(By.CSS_SELECTOR, "#jobs-table tbody tr")
    assert [r.get_attribute("data-job") for r in rows] == [failed]
    prefix = console.find("#filter-prefix")
    prefix.clear()
    prefix.send_keys("notes/")
    console.find("#apply-filters").click()
    console.until(lambda: "0 of 0 jobs" in console.text("#jobs-count"), "no failed notes/ job")
    console.open("jobs?status=FAILED&prefix=inbox/")
    console.until(lambda: "of 1 job" in console.text("#jobs-count"), "the failed job again")
    console.screenshot("jobs")

    console.find(f'a[href="#/job/{failed}"]').click()
    console.until(lambda: console.text("#failure-type") == "EMBEDDING_RESULT_INVALID", "detail")
    assert console.text("#failure-message")
    assert "JOB_FAILED" in console.text("#events") and "JOB_ENQUEUED" in console.text("#events")
    assert "FAILED" in console.text("#attempts")
    console.screenshot("job-failed")
    console.find("#retry-job").click()
    console.confirm()
    console.until(lambda: console.text("#job-status") == "SUCCEEDED", "the retried job to succeed")
    assert "JOB_RETRY_REQUESTED" in console.text("#events")
    console.screenshot("job-succeeded")
    console.drain_log()


def test_a_read_key_is_refused_every_action(admin: Console) -> None:
    console = admin
    key = "refused/broken.md"
    failed = console.failed(key, b"# Broken\n\nAnother bad embedding.\n")
    console.sign_out()
    assert console.browser.get_cookie("trioindex_session") is None
    console.sign_in("read")

    console.open(f"job/{failed}")
    console.until(lambda: console.find("#retry-job"), "the retry button")
    console.find("#retry-job").click()
    console.confirm()
    console.until(
        lambda: "Refused: this needs a admin key" in console.text("#job-actions"), "refusal"
    )
    assert console.job(key)["status"] == "FAILED"
    console.open(f"document/{key}")
    console.until(lambda: console.find("#delete-document"), "the delete button")
    console.find("#delete-document").click()
    console.confirm()
    console.until(
        lambda: "Refused: this needs a write key" in console.text("#document-actions"), "no"
    )

    # an action without the session's CSRF token is refused, whatever the role
    answer = console.browser.execute_async_script(
        """const done = arguments[arguments.length - 1];
           fetch('/v1/jobs/retry-failed', {method: 'POST', credentials: 'same-origin',
                 headers: {'Content-Type': 'application/json'},
                 body: JSON.stringify({failure_type: 'EMBEDDING_RESULT_INVALID'})})
             .then(r => r.json().then(b => done([r.status, b.error.code])));"""
    )
    assert answer == [403, "csrf_failed"]
    console.sign_out()
    console.sign_in("admin")
    # no failure left behind for the other tests' counts
    assert console.api("POST", f"/v1/jobs/{failed}/retry").status_code == 200
    wait_for(lambda: console.job(key)["status"] == "SUCCEEDED", WAIT, "the retried job")
    console.drain_log()


def failed_of_type(console: Console, failure_type: str) -> int:
    """How many jobs failed with ``failure_type``, as the overview's failures table counts."""
    (row,) = query(
        console.service.database_url,
        "SELECT count(*) AS n FROM embedding_jobs"
        " WHERE status = 'FAILED' AND last_failure_type = %s",
        failure_type,
    )
    return int(row["n"])


def test_retry_all_failed_of_a_type_with_a_count_and_a_confirmation(admin: Console) -> None:
    console = admin
    key = "retry-all/broken.md"
    console.failed(key, b"# Broken\n\nA bad embedding, retried with its type.\n")
    n = failed_of_type(console, "EMBEDDING_RESULT_INVALID")
    console.open("overview")
    button = 'button[data-retry-type="EMBEDDING_RESULT_INVALID"]'
    console.until(lambda: console.find(button).text == f"Retry all {n}", "the failures table")
    console.screenshot("overview")
    console.find(button).click()
    console.until(lambda: f"Send {n} FAILED job" in console.text("#confirm-text"), "the count")
    console.find("#confirm-ok").click()
    console.until(lambda: f"{n} job" in console.text("#retry-notice"), "the answer")
    wait_for(lambda: console.job(key)["status"] == "SUCCEEDED", WAIT, "done")
    console.drain_log()


def test_workers_and_documents_then_delete_as_admin(admin: Console) -> None:
    console = admin
    console.indexed("shelf/kept.md", b"# Kept\n\nA document that stays.\n")
    console.indexed("shelf/gone.md", b"# Gone\n\nA document deleted from the console.\n")
    console.embed.set_mode("slow", latency=3.0)  # the worker is busy while the page looks
    console.upload("shelf/slow.md", b"# Slow\n\nA document the embedding server takes time on.\n")
    console.open("workers")
    console.until(lambda: "shelf/slow.md" in console.text("#workers-table"), "its running job")
    assert "RUNNING" in console.text("#workers-table")
    assert "1 / " in console.text("#workers-table")  # slots used / max
    console.screenshot("workers")
    console.embed.set_mode("normal")
    wait_for(lambda: console.job("shelf/slow.md")["status"] == "SUCCEEDED", WAIT, "slow.md")

    console.open("documents")
    console.until(lambda: "shelf/kept.md" in console.text("#documents-table"), "documents")
    field = console.find("#document-prefix")
    field.send_keys("shelf/g")
    field.submit()

    def only_gone() -> bool:
        shown = console.text("#documents-table")
        return "shelf/gone.md" in shown and "shelf/kept.md" not in shown

    console.until(only_gone, "the prefix search")
    console.screenshot("documents")

    console.find('a[href="#/document/shelf%2Fgone.md"]').click()
    console.until(lambda: "serves v1" in console.text("#document-detail"), "its models' state")
    console.screenshot("document")
    console.find("#delete-document").click()
    console.confirm()
    console.until(lambda: "#/documents" in console.browser.current_url, "back to the list")
    assert console.api("GET", "/v1/documents/shelf/gone.md").status_code == 404
    console.drain_log()


def test_search_shows_a_highlighted_passage(admin: Console) -> None:
    console = admin
    console.indexed("harbour/ledger.md", TOPIC + b"Entry 0: calm water.\n")
    console.open("search?prefix=harbour/")
    field = console.until(lambda: console.find("#search-query"), "the query box")
    field.send_keys("lighthouse ledger")
    Select(console.find("#filter-mode")).select_by_value("text")
    console.find("#search-button").click()
    console.until(lambda: console.find("#search-latency"), "the results")
    marks = [m.text.lower() for m in console.browser.find_elements(By.CSS_SELECTOR, "mark")]
    assert "lighthouse" in marks and "ledger" in marks, console.text("#search-results")
    assert "ms" in console.text("#search-latency")
    assert "harbour/ledger.md" in console.text("#search-results")
    console.screenshot("search")
    console.drain_log()


def test_no_request_leaves_the_machine_and_every_page_has_the_policy(admin: Console) -> None:
    console = admin
    for page in ("overview", "jobs", "workers", "documents", "search"):  # requests of its own
        console.open(page)
        console.until(lambda: console.find("#who-name"), f"the {page} page")
    for path in ("/console/", "/console/console.js", "/console/console.css", "/console/icon.svg"):
        answer = httpx.get(console.service.url + path)
        assert answer.status_code == 200, path
        assert answer.headers["content-security-policy"].startswith("default-src 'self'")
        assert answer.headers["x-content-type-options"] == "nosniff"
        text = answer.text.replace("http://www.w3.org/2000/svg", "")  # a name, never fetched
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, path
    assert httpx.get(console.service.url + "/console/../app.py").status_code == 404
    assert httpx.get(console.service.url + "/console/nothing.js").status_code == 404
    console.drain_log()
    own = urlsplit(console.service.url)
    assert console.requested, "the performance log recorded no request"
    elsewhere = [
        url
        for url in console.requested
        if not url.startswith(("data:", "about:"))
        and (urlsplit(url).scheme, urlsplit(url).netloc) != (own.scheme, own.netloc)
    ]
    assert elsewhere == []
    errors = [e for e in console.browser.get_log("browser") if e["level"] == "SEVERE"]
    # what the console asked for and was refused (401 before sign-in, 403 for the read key) is
    # logged by the browser as a failed resource; nothing else may be
    assert all(" 40" in e["message"] for e in errors), errors
