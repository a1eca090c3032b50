"""The built documentation site (`mkdocs build --strict` into site/) in a real headless browser
(Debian's chromium and chromium-driver, driven by selenium), opened from disk as a reader would: three
pages load without a console error and without a request outside the site, and the search box finds
"compact store".

It needs the built site: where site/ is absent it skips and says so. `.ci/run` builds the site, then runs
this file explicitly (`python -m pytest -m slow tests/docs/test_site_browser.py`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.analysis.test_viewer_browser import headless_chrome

pytestmark = pytest.mark.slow

SITE = Path(__file__).resolve().parents[2] / "site"
PAGES = ["index.html", "concepts/codes-file.html", "tutorials/03-smollm2-induction.html"]


@pytest.fixture(scope="module")
def browser():
    if not (SITE / "index.html").is_file():
        pytest.skip(f"no built site at {SITE}: build it first (pip install -e '.[docs]' && mkdocs build --strict)")
    driver = headless_chrome(window="1400,1000")
    yield driver
    driver.quit()


def requested_urls(driver) -> list[str]:
    events = [json.loads(entry["message"])["message"] for entry in driver.get_log("performance")]
    return [event["params"]["request"]["url"] for event in events if event["method"] == "Network.requestWillBeSent"]


def open_page(driver, page: str) -> str:
    driver.get_log("browser"), driver.get_log("performance")  # start from empty logs
    url = (SITE / page).as_uri()
    driver.get(url)
    for _ in range(200):
        if driver.execute_script("return document.readyState") == "complete":
            break
        time.sleep(0.05)
    time.sleep(1.0)  # the theme's scripts and the notebooks' iframes settle
    return url


@pytest.mark.parametrize("page", PAGES)
def test_a_page_loads_from_disk_without_console_errors_or_requests_outside_the_site(browser, page):
    assert (SITE / page).is_file(), f"{page} was not built"
    url = open_page(browser, page)
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []
    urls = requested_urls(browser)
    assert urls and urls[0] == url
    outside = [address for address in urls
               if not (address.startswith(SITE.as_uri() + "/") or address.startswith(("data:", "blob:", "about:")))]
    assert outside == []


def test_the_site_has_no_script_or_stylesheet_from_elsewhere():
    if not (SITE / "index.html").is_file():
        pytest.skip(f"no built site at {SITE}")
    import re

    remote = re.compile(r"<(?:script|link)\b[^>]*(?:src|href)=[\"']?(?:https?:)?//", re.IGNORECASE)
    offenders = [str(path.relative_to(SITE)) for path in SITE.rglob("*.html") if remote.search(path.read_text(errors="replace"))]
    assert offenders == []


@pytest.fixture(scope="module")
def served_site():
    """The site served on the loopback interface (as `mkdocs serve` would), for the search: its worker
    does not start in headless Chromium from file:// (the offline plugin's shim), see the note below."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(SITE))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


# Opened from disk, the search panel stays at "Initializing search" in headless Chromium (the offline
# plugin's iframe-worker shim, served from the site); served, it answers. Known gap, not hidden.
def test_the_search_box_finds_the_compact_store(browser, served_site):
    from selenium.webdriver.common.by import By

    browser.get_log("browser")
    browser.get(served_site + "index.html")
    time.sleep(1.0)
    browser.execute_script("document.getElementById('__search').checked = true")  # open the search panel
    box = browser.find_element(By.CSS_SELECTOR, "input.md-search__input")
    box.click()
    box.send_keys("compact store")
    titles: list[str] = []
    for _ in range(100):
        items = browser.find_elements(By.CSS_SELECTOR, ".md-search-result__item")
        titles = [item.get_attribute("textContent") or "" for item in items]
        if titles:
            break
        time.sleep(0.1)
    assert titles, "the search found nothing for 'compact store'"
    assert any("compact store" in title.lower() for title in titles), titles
    assert [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"] == []
