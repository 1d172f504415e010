"""The dashboard and the API docs as a person sees them: Debian's chromium, headless,
driven by Selenium through chromium-driver, against a real ``fleetcare serve`` (auth on,
as in production) over a real simulated fleet.

Signs in through the form with a read token, opens the overview, follows a node link,
checks the node page's charts have drawn lines, checks /docs renders every operation of
the spec, signs out, and checks a revoked token ends its session. No console errors on
any page. Screenshots of the overview and a node page are kept in
``$FLEETCARE_TEST_ARTIFACTS`` (default: the test's temporary directory; the README's copies
are in docs/img/).

Needs ``deploy/browser/install.sh`` (``make test`` runs it).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

FLEETCARE = [sys.executable, "-m", "fleetcare.api.cli"]
CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
HTTP_METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}

if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip("chromium and chromedriver are not installed: run `sh deploy/browser/"
                "install.sh` (make test does)", allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is a dev extra: "
                                "`pip install -e '.[dev]'`")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([*FLEETCARE, *args], capture_output=True, text=True,
                         timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert out.returncode == 0, f"fleetcare {' '.join(args)}: {out.stderr[-2000:]}"
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = os.environ.get("FLEETCARE_TEST_ARTIFACTS")
    path = Path(where) if where else tmp_path_factory.mktemp("browser-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A simulated fleet, trained and scored, served by ``fleetcare serve`` with auth on;
    a read token (the browser's) and an admin token (to revoke it)."""
    db = tmp_path_factory.mktemp("browser") / "fleet.duckdb"
    run("simulate", "--nodes", "24", "--days", "12", "--seed", "5", "--failure-scale", "20",
        "--interval", "10m", "--db", str(db), "--json")
    run("train", "--db", str(db), "--horizon", "24h", "--min-failures", "5", "--json")
    run("score", "--db", str(db), "--json")
    read = run("tokens", "create", "--scope", "read", "--name", "browser", "--db",
               str(db)).stdout.strip()
    admin = run("tokens", "create", "--scope", "admin", "--db", str(db)).stdout.strip()
    port = _free_port()
    proc = subprocess.Popen([*FLEETCARE, "serve", "--db", str(db), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "fleetcare serve did not answer in 60 s"
            time.sleep(0.3)
        yield {"base": base, "read": read, "admin": admin}
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--no-first-run", "--disable-extensions"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # chromium's own temporary files (a singleton-socket folder per run, which it leaves
    # behind) go under pytest's temporary directory, not the machine's /tmp
    env = {**os.environ, "TMPDIR": str(tmp_path_factory.mktemp("chromium-tmp"))}
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER, env=env), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver: Any) -> list[str]:
    """SEVERE entries of the browser's console log since the last call."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def full_page_screenshot(driver: Any, path: Path) -> None:
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, min(max(int(height) + 40, 800), 1800))  # README-sized
    driver.save_screenshot(str(path))
    driver.set_window_size(1400, 1000)
    assert path.stat().st_size > 10_000, path


def sign_in(driver: Any, base: str, token: str) -> None:
    driver.get(f"{base}/")
    assert "Sign in" in driver.title + driver.page_source
    field = driver.find_element(By.NAME, "token")
    field.send_keys(token)
    field.submit()
    WebDriverWait(driver, 20).until(lambda d: "which nodes to drain" in d.title)


def test_sign_in_overview_node_page_and_charts(served: dict[str, str], browser: Any,
                                               artifacts: Path) -> None:
    base = served["base"]
    sign_in(browser, base, served["read"])
    assert browser.current_url == f"{base}/"
    cookie = browser.get_cookie("fleetcare_session")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert "expiry" in cookie and not cookie["secure"]  # plain http on loopback
    page = browser.page_source
    assert "SIMULATED DATA" in page
    for text in ("alerts firing", "drains held", "Data freshness", "Nodes by risk",
                 "Scoring with", ">Repeat offenders<"):
        assert text in page, text
    assert console_errors(browser) == []
    full_page_screenshot(browser, artifacts / "dashboard-overview.png")

    links = browser.find_elements(By.CSS_SELECTOR, "table a[href^='/nodes/']")
    assert links, "the overview links no node"
    node = links[0].text
    links[0].click()
    WebDriverWait(browser, 20).until(lambda d: f"node {node}" in d.title)
    assert browser.current_url == f"{base}/nodes/{node}"
    series = browser.find_elements(By.CSS_SELECTOR, "figure.chart svg path.series")
    medians = browser.find_elements(By.CSS_SELECTOR, "figure.chart svg path.median")
    assert series and medians, "the node page drew no chart line"
    for path in series + medians:
        d = path.get_attribute("d")
        assert d and d.startswith("M") and len(d.split()) >= 2, d
    assert "SIMULATED DATA" in browser.page_source
    for heading in ("Reasons", "Signal history against the fleet", "Recent XIDs",
                    "Repeat failures", "Incidents", "Drain", "Audit trail"):
        assert f">{heading}<" in browser.page_source, heading
    assert console_errors(browser) == []
    full_page_screenshot(browser, artifacts / "dashboard-node.png")

    # the charts draw what the API serves: the first chart's GPU has points there
    hist = httpx.get(f"{base}/v1/nodes/{node}/history",
                     headers={"Authorization": f"Bearer {served['read']}"}, timeout=30)
    assert hist.status_code == 200, hist.text
    assert any(p["v"] is not None for g in hist.json()["gpus"]
               for pts in g["series"].values() for p in pts)

    for path, title in (("/alerts", "alerts"), ("/drains", "drains"),
                        ("/models", "model registry")):
        browser.get(f"{base}{path}")
        assert f"fleetcare: {title}" in browser.title
        assert console_errors(browser) == []


def test_docs_render_every_operation(served: dict[str, str], browser: Any) -> None:
    base = served["base"]
    spec = httpx.get(f"{base}/openapi.json", timeout=10).json()
    operations = sum(1 for item in spec["paths"].values() for m in item if m in HTTP_METHODS)
    assert operations >= 15
    browser.get(f"{base}/docs")
    try:
        WebDriverWait(browser, 60).until(
            lambda d: len(d.find_elements(By.CSS_SELECTOR, ".opblock")) >= operations)
    finally:
        rendered = len(browser.find_elements(By.CSS_SELECTOR, ".opblock"))
        problems = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".errors-wrapper")]
    assert rendered == operations, (rendered, operations, problems)
    assert "Unable to render this definition" not in browser.page_source
    assert spec["openapi"].startswith("3.1") and f"OAS {spec['openapi'][:3]}" in \
        browser.page_source
    assert console_errors(browser) == []


def test_sign_out_and_revoked_token_end_the_session(served: dict[str, str],
                                                    browser: Any) -> None:
    base = served["base"]
    browser.delete_all_cookies()
    sign_in(browser, base, served["read"])
    browser.find_element(By.CSS_SELECTOR, "form[action='/logout'] button").click()
    WebDriverWait(browser, 20).until(lambda d: d.find_elements(By.NAME, "token"))
    assert browser.get_cookie("fleetcare_session") is None

    sign_in(browser, base, served["read"])
    admin = {"Authorization": f"Bearer {served['admin']}"}
    tokens = httpx.get(f"{base}/v1/tokens", headers=admin, timeout=10).json()["tokens"]
    [mine] = [t for t in tokens if t["name"] == "browser"]
    r = httpx.post(f"{base}/v1/tokens/{mine['id']}/revoke", headers=admin, timeout=10)
    assert r.status_code == 200, r.text
    browser.get(f"{base}/")
    assert browser.find_elements(By.NAME, "token"), "a revoked token's session still works"
    field = browser.find_element(By.NAME, "token")
    field.send_keys(served["read"])
    field.submit()
    WebDriverWait(browser, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".error"))
    assert "not valid" in browser.find_element(By.CSS_SELECTOR, ".error").text
    # a 401 page load is not a script error; anything else in the console is
    assert [e for e in console_errors(browser) if "401" not in e] == []
