"""The web UI in a real headless browser (Debian's chromium via Selenium and chromedriver): every
page loads with no console error (a CSP violation or a failed load is one), links lead from the
overview to a state, a diff and a resource, search finds a resource by an attribute value, no
secret is ever in the DOM, and without credentials nothing is shown.

Screenshots of every page, at desktop and phone width, go to $KL_UI_SCREENSHOTS (default: this
session's pytest temp dir, under ui-screenshots/)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from kit.browser import DESKTOP, PHONE, basic, chrome, console_problems, quit_quietly, screenshot, screenshot_dir
from kit.uistates import SECRETS, populate

TOKEN = "browser-test-token"

PAGES = {
    "overview": "/ui/",
    "overview-filtered": "/ui/?" + urlencode({"q": "team/*", "sort": "drift", "order": "desc"}),
    "state": "/ui/state?" + urlencode({"name": "team/prod"}),
    "diff": "/ui/diff?" + urlencode({"state": "team/prod", "from": 1, "to": 5}),
    "diff-unknown-schema": "/ui/diff?" + urlencode({"state": "sandbox", "from": 7, "to": 8}),
    "resource": "/ui/resource?" + urlencode({"state": "team/prod", "address": "cloud_server.bravo"}),
    "search": "/ui/search?" + urlencode({"attr": 'tags["env"] = "prod"'}),
    "error": "/ui/state?" + urlencode({"name": "no/such/state"}),
}


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return screenshot_dir(tmp_path_factory.mktemp("ui-screenshots"))


@pytest.fixture
def base_url(start_server, conn) -> str:
    from kilolock.server.auth import Authenticator

    populate(conn)
    return start_server(auth=Authenticator(token=TOKEN)).url


@pytest.fixture
def browser() -> Iterator[Any]:
    driver = chrome(*DESKTOP, authorization=basic("viewer", TOKEN))
    yield driver
    quit_quietly(driver)


@pytest.fixture
def phone() -> Iterator[Any]:
    driver = chrome(*PHONE, authorization=basic("viewer", TOKEN))
    yield driver
    quit_quietly(driver)


def _open(driver: Any, url: str) -> None:
    driver.get(url)
    assert driver.find_element("css selector", "main h1").text, f"{url}: no heading"


def _heading(driver: Any, expected: str) -> None:
    """Wait for the page a click leads to: its heading (a click does not wait for a form's navigation)."""
    _text(driver, "main h1", expected)


def _text(driver: Any, css: str, expected: str) -> None:
    """Wait until the element CSS of the page a click leads to reads EXPECTED."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    def arrived(d: Any) -> bool:
        try:
            return bool(d.find_element("css selector", css).text == expected)
        except WebDriverException:  # not there yet, or the old page went away under us: look again
            return False

    WebDriverWait(driver, 30).until(arrived, f"no {css} reading {expected!r}")


def test_every_page_loads_with_no_console_error_and_no_secret(browser, phone, base_url: str, shots: Path) -> None:
    for width, driver in (("desktop", browser), ("phone", phone)):
        for name, path in PAGES.items():
            _open(driver, base_url + path)
            problems = [p for p in console_problems(driver) if not (name == "error" and "404" in p)]
            assert problems == [], f"{name} at {width}: {problems}"
            source = driver.page_source
            for secret in SECRETS:
                assert secret not in source, f"{name} shows a secret"
            # the stylesheet applied (CSP allows it): the header bar has its colour
            assert driver.find_element("css selector", "header.top").value_of_css_property("background-color") == "rgba(31, 78, 121, 1)"
            if width == "phone":
                overflow = driver.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
                assert overflow <= 0, f"{name} is {overflow}px wider than a phone screen"
            screenshot(driver, shots, f"{name}-{width}")


def test_the_overview_fits_a_phone_with_drift_and_last_refresh_in_view(phone, base_url: str, conn, shots: Path) -> None:
    from kilolock.store import refresh_runs, states, versions

    # A run of team/prod, so its last-refresh cell holds its longest text (a time, an age, a status).
    sid = states.state_id(conn, "team/prod")
    current = versions.current_version(conn, sid)
    assert current is not None
    run = refresh_runs.begin(conn, sid, current.id, "kl-refresh")
    refresh_runs.finish(conn, run, status="failed", checked=4, changed=0, failed=1, error_summary="1 resource(s) failed",
                        to_version_id=None)
    _open(phone, base_url + "/ui/")
    screenshot(phone, shots, "overview-states-phone")
    _fits_sideways(phone, "the overview")
    rows = phone.find_elements("css selector", "table.states tbody tr")
    assert len(rows) == 3
    for row in rows:
        name = row.find_element("css selector", "th").text
        for column in ("col-drift", "col-refreshed"):
            cell = row.find_element("css selector", f"td.{column}")
            box = phone.execute_script("const b = arguments[0].getBoundingClientRect(); return [b.left, b.right, b.width]", cell)
            assert cell.is_displayed() and cell.text and box[2] > 0, f"{name}: {column} is not shown"
            assert 0 <= box[0] and box[1] <= PHONE[0], f"{name}: {column} spans {box[0]}..{box[1]}px, off a {PHONE[0]}px screen"
    prod = next(r for r in rows if r.find_element("css selector", "th").text.startswith("team/prod"))
    assert "1 drifted" in prod.find_element("css selector", "td.col-drift").text
    assert "failed" in prod.find_element("css selector", "td.col-refreshed").text
    # Search results are cards on a phone too (their provider column scrolled off the screen).
    _open(phone, base_url + PAGES["search"])
    _fits_sideways(phone, "search results")


def _fits_sideways(driver: Any, what: str) -> None:
    """Neither the page nor a table's scrolling region in it is wider than the phone's screen."""
    page = driver.execute_script("return [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert page[1] == PHONE[0] and page[0] <= page[1], f"{what}: the page is {page[0]}px wide on a {page[1]}px phone"
    regions = driver.execute_script("return [...document.querySelectorAll('main .scroll')].map("
                                    "r => [r.getAttribute('aria-label'), r.scrollWidth, r.clientWidth])")
    assert regions, f"{what}: no table"
    wide = [r for r in regions if r[1] > r[2]]
    assert wide == [], f"{what}: these scroll sideways ([region, width, visible width]): {wide}"


def test_navigation_by_links_from_overview_to_state_diff_and_resource(browser, base_url: str, shots: Path) -> None:
    _open(browser, base_url + "/ui/")
    browser.find_element("link text", "team/prod").click()
    _heading(browser, "team/prod")
    # the diff link of the newest version compares it with the one before
    browser.find_element("css selector", "table.versions tbody tr:first-child a").click()
    _heading(browser, "team/prod: serial 4 → 5")
    assert "~1 changed" in browser.find_element("css selector", "p.summary").text
    browser.find_element("link text", "cloud_server.alpha").click()
    _heading(browser, "cloud_server.alpha")
    events = [e.text for e in browser.find_elements("css selector", "ol.timeline .what strong")]
    assert events == ["drifted (seen by refresh)", "changed by apply", "imported"]
    screenshot(browser, shots, "navigated-resource-desktop")
    # and back up through the breadcrumb
    browser.find_element("css selector", "nav.crumbs").find_element("link text", "States").click()
    _heading(browser, "States")
    assert console_problems(browser) == []


def test_the_diff_form_and_the_sort_links_work_without_script(browser, base_url: str) -> None:
    _open(browser, base_url + "/ui/state?" + urlencode({"name": "team/prod"}))
    browser.find_element("id", "from").send_keys("1")
    browser.find_element("css selector", "form.diff-form button").click()
    _heading(browser, "team/prod: serial 1 → 5")
    _open(browser, base_url + "/ui/")
    browser.find_element("link text", "Open drift").click()
    first = browser.find_element("css selector", "table.states tbody tr:first-child th").text
    assert first.startswith("team/prod")


def test_search_finds_a_resource_by_attribute_value(browser, base_url: str, shots: Path) -> None:
    _open(browser, base_url + "/ui/")
    browser.find_element("link text", "Search").click()
    browser.find_element("id", "attr").send_keys('tags["env"] = "dev"')
    browser.find_element("css selector", "form.search button").click()
    _text(browser, "#results", "1 result")  # the search form's submission is not waited for by click
    screenshot(browser, shots, "search-dev-desktop")
    browser.find_element("link text", "cloud_server.echo").click()
    _heading(browser, "cloud_server.echo")
    assert console_problems(browser) == []


def test_without_credentials_the_browser_is_refused(base_url: str, shots: Path) -> None:
    driver = chrome(*DESKTOP, authorization=None)
    try:
        driver.get(base_url + "/ui/state?" + urlencode({"name": "team/prod"}))
        # chromium answers a Basic challenge it has no credentials for with an empty page
        status = driver.execute_script("return performance.getEntriesByType('navigation')[0].responseStatus")
        assert status == 401
        assert "cloud_server" not in driver.page_source and "team/prod" not in driver.page_source
        screenshot(driver, shots, "unauthenticated-desktop")
    finally:
        quit_quietly(driver)
