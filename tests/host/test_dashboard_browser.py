"""The dashboard in a real browser: Debian's chromium, headless, driven by selenium through the system
``chromedriver`` (nothing downloaded), on a worker of a real main + worker pair over TCP.

The page loads with no console errors and shows both instances and the streams; a fact written on
the main changes a position on screen; stopping the main turns the worker's link red ("down for
Ns"), starting it again turns it green. The test then saves the screenshot docs/dashboard.md shows
(``docs/images/dashboard.png``): when it is missing, or on every run with
``FACTSTREAM_UPDATE_SCREENSHOT=1``.

Without chromium or its driver the test is skipped with what is missing, unless
``FACTSTREAM_REQUIRE_SERVICES=1`` (CI, where ``.ci/run`` installs both): then it fails. Where ``.ci/run``
could not install them it sets ``FACTSTREAM_NO_BROWSER`` to the reason, and the test is skipped with it.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from factstream.testing import ProcessCluster, free_port, wait_until
from tests.host.conftest import INBOX_PROJECT, TOKENS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "docs" / "images" / "dashboard.png"
#: The colours of dashboard.css's ``--up`` and ``--down``, as the browser reports them.
GREEN = "rgba(31, 157, 85, 1)"
RED = "rgba(208, 49, 45, 1)"
#: How long the page may take to show a change (it polls every second).
SEEN_WITHIN = 15.0


def _required() -> bool:
    return os.environ.get("FACTSTREAM_REQUIRE_SERVICES", "").lower() in {"1", "true", "yes"}


def _find(name: str, default: str) -> str | None:
    found = shutil.which(name) or default
    return found if os.access(found, os.X_OK) else None


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless chromium under selenium, keeping the page's console log."""
    chromium = _find("chromium", "/usr/bin/chromium")
    driver_path = _find("chromedriver", "/usr/bin/chromedriver")
    missing = [
        what for what, path in (("chromium", chromium), ("chromedriver (chromium-driver)", driver_path)) if not path
    ]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ModuleNotFoundError:
        missing.append("the selenium package (uv sync: it is a dev dependency)")
    if missing and os.environ.get("FACTSTREAM_NO_BROWSER"):
        pytest.skip(f"no browser: {os.environ['FACTSTREAM_NO_BROWSER']}")
    if missing:
        message = f"the browser test needs {', '.join(missing)}: apt-get install chromium chromium-driver"
        if _required():
            pytest.fail(message + " (FACTSTREAM_REQUIRE_SERVICES=1)")
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1200",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


class Pair:
    """main and worker1 as ``factstream run`` processes, each with its HTTP port in instance_map."""

    def __init__(self, processes: ProcessCluster) -> None:
        self.processes = processes
        self.ports = {"main": free_port(), "worker1": free_port()}
        processes.env["FACTSTREAM_LOAD_PLUGINS"] = "inbox"
        processes.configure(
            deployment="example",
            instance_map={name: {"http_port": port} for name, port in self.ports.items()},
            stream_writers={"inbox": ["main"]},
            http={"tokens": TOKENS},
        )

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def write(self, body: str) -> int:
        """A fact written on main through its HTTP write route; its stream ID."""
        response = httpx.post(
            self.url("main") + "/inbox/messages",
            json=[{"user_id": "@alice:hs", "body": body}],
            headers={"Authorization": "Bearer writer-token"},
            timeout=10,
        )
        assert response.status_code == 200, response.text
        return int(response.json()["stream_ids"][-1])


def text_of(driver: Any, css: str) -> str:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return str(driver.find_element("css selector", css).text)
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def link_state(driver: Any) -> tuple[str, str, str]:
    """The worker's link to main as drawn: (row class, badge text, badge colour)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        row = driver.find_element("css selector", 'tr.link[data-peer="main"]')
        badge = row.find_element("css selector", ".badge")
        return str(row.get_attribute("class")), str(badge.text), str(badge.value_of_css_property("color"))
    except (NoSuchElementException, StaleElementReferenceException):
        return "", "", ""


def severe_console_entries(driver: Any) -> list[dict[str, Any]]:
    return [entry for entry in driver.get_log("browser") if entry.get("level") == "SEVERE"]


def cards_scrolling_sideways(browser: Any) -> list[str]:
    """The ids of the page's cards wider than the 1400 px window gives them."""
    return list(
        browser.execute_script(
            "return [...document.querySelectorAll('section')]"
            ".filter(s => s.scrollWidth > s.clientWidth + 1).map(s => s.id)"
        )
    )


def test_the_caches_card_holds_the_bundled_plugins_caches_without_scrolling_sideways(
    browser, plugin_installer, process_cluster
):
    """The caches table filled with the bundled plugins' caches (their real names, large counts) in the
    page's own layout at 1400 px, measured in the same script that fills it (the page redraws every
    second): it scrolled sideways, hiding evictions and invalidations."""
    from factstream.plugin.manager import load_plugins

    names = [c.spec.name for c in load_plugins().registry.caches]
    assert len(names) >= 10, names
    plugin_installer.from_project(INBOX_PROJECT)
    pair = Pair(process_cluster)
    process_cluster.start("main")
    browser.get(pair.url("main") + "/dashboard")
    wait_until(lambda: text_of(browser, 'tr[data-instance="main"]'), SEEN_WITHIN, "the page drawn")
    sideways = browser.execute_script(
        """
        const table = document.getElementById('caches');
        table.hidden = false;
        document.getElementById('caches-empty').hidden = true;
        const body = table.querySelector('tbody');
        body.replaceChildren();
        for (const name of arguments[0]) {
          const row = document.createElement('tr');
          for (const text of [name, '1,234,567 / 10,000,000', '98,765,432', '1,234,567', '98.8%',
                              '12,345,678', '23,456,789']) {
            const cell = document.createElement('td');
            cell.textContent = text;
            if (text !== name) cell.className = 'num';
            row.appendChild(cell);
          }
          body.appendChild(row);
        }
        return [...document.querySelectorAll('section')]
          .filter(s => s.scrollWidth > s.clientWidth + 1).map(s => s.id);
        """,
        names,
    )
    assert sideways == []


def test_the_worker_dashboard_shows_the_deployment_live_in_a_browser(browser, plugin_installer, process_cluster):
    plugin_installer.from_project(INBOX_PROJECT)
    pair = Pair(process_cluster)
    process_cluster.start("main")
    process_cluster.start("worker1")
    logs = process_cluster.logs
    first = pair.write("before the page")

    browser.get(pair.url("worker1") + "/dashboard")

    # both instances and the streams, the link up (green) once the worker applied the first fact
    wait_until(
        lambda: text_of(browser, 'tr[data-instance="main"]') and text_of(browser, 'tr[data-instance="worker1"]'),
        SEEN_WITHIN,
        "both instances on the page",
        detail=logs,
    )
    wait_until(
        lambda: text_of(browser, 'tr[data-stream="inbox"] td.current') == f"{first:,}",
        SEEN_WITHIN,
        "the inbox stream at the first fact's position",
        detail=logs,
    )
    assert "worker1" in text_of(browser, "#instance")
    assert cards_scrolling_sideways(browser) == []
    main_row = browser.find_element("css selector", 'tr[data-instance="main"] a')
    assert main_row.get_attribute("href") == pair.url("main") + "/dashboard"
    row, badge, colour = wait_until(lambda: link_state(browser)[0] and link_state(browser), SEEN_WITHIN, "the link")
    assert "up" in row.split() and badge.startswith("up for") and colour == GREEN, (row, badge, colour)

    # a fact written on main changes the position on the worker's page
    second = pair.write("while watching")
    assert second > first
    wait_until(
        lambda: text_of(browser, 'tr[data-stream="inbox"] td.current') == f"{second:,}",
        SEEN_WITHIN,
        "the new position on screen",
        detail=logs,
    )

    # main stops: the worker's link turns red, "down for Ns"
    process_cluster.processes["main"].stop()
    wait_until(lambda: "down" in link_state(browser)[0].split(), SEEN_WITHIN, "the link to turn red", detail=logs)
    row, badge, colour = link_state(browser)
    assert badge.startswith("down for") and colour == RED, (row, badge, colour)
    wait_until(lambda: "down for" in text_of(browser, 'tr[data-instance="main"]'), SEEN_WITHIN, "main marked down")

    # main returns: green again
    process_cluster.start("main")
    wait_until(lambda: "up" in link_state(browser)[0].split(), 30.0, "the link to turn green again", detail=logs)
    assert link_state(browser)[2] == GREEN
    for i in range(6):  # a few seconds of writes: something for the sparkline
        last = pair.write(f"after the return {i}")
        time.sleep(0.5)
    wait_until(
        lambda: text_of(browser, 'tr[data-stream="inbox"] td.current') == f"{last:,}",
        SEEN_WITHIN,
        "the position after the return",
        detail=logs,
    )

    assert severe_console_entries(browser) == []
    if os.environ.get("FACTSTREAM_UPDATE_SCREENSHOT") == "1" or not SCREENSHOT.exists():
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(SCREENSHOT)), f"could not write {SCREENSHOT}"
