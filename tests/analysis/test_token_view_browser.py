"""The token view in a real headless browser (Debian's chromium + chromium-driver, driven by selenium),
its network closed but for the local server: clicking a token draws every head's row of the chosen
layer, equal within display rounding to `CodeFile.compact.rows` of that query (the file read here,
not through the viewer); a token whose text is `<script>...` is text; the pair's relations are those
computed here from the token ids; no console error, no request outside 127.0.0.1.

Fast: a tiny random Llama's file (48 tokens), served and as a static page. Slow: SmolLM2 at T = 2,048
(an extraction of about a minute on 2 cores). Skipped, with the reason, where no browser is found."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from latentcode.store import CodeFile
from tests.analysis.test_viewer_browser import headless_chrome
from tests.analysis.token_files import SCRIPT, Served, rename_token, tiny_token_file

TOLERANCE = 5e-4 + 1e-6  # the static page's rows: 3 decimals


@pytest.fixture(scope="module")
def browser():
    # No name resolves but 127.0.0.1's: a request elsewhere fails here, and the log shows it.
    driver = headless_chrome("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny model's file, the token at position 3 of example 0 renamed `<script>...`."""
    _, codes = tiny_token_file(tmp_path_factory.mktemp("token-view"))
    rename_token(codes, int(CodeFile(codes).extra("token_ids")[0, 3]), SCRIPT)
    return codes


@pytest.fixture(scope="module")
def served(tiny):
    server = Served(tiny)
    yield server
    status, out, _ = server.stop()
    assert status == 0 and out.strip() == f"stopped serving {server.url}"


def open_view(driver, url: str) -> None:
    driver.get("about:blank")  # a new document, even where only the #hash differs
    driver.get_log("browser"), driver.get_log("performance")  # start from empty logs
    driver.get(url)
    for _ in range(600):
        if driver.execute_script("return document.body && document.body.dataset.ready") == "true":
            return
        time.sleep(0.05)
    raise AssertionError(f"the token view at {url} did not draw in 30 s: {driver.get_log('browser')}")


def click_token(driver, position: int) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    span = driver.find_element("css selector", f"#tokens span[data-pos='{position}']")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", span)
    ActionChains(driver).move_to_element(span).click().perform()
    for _ in range(600):
        if driver.execute_script("return document.body.dataset.drawnQuery") == str(position):
            return
        time.sleep(0.02)
    raise AssertionError(f"clicking token {position} drew no row: {driver.get_log('browser')}")


def drawn_rows(driver) -> np.ndarray:
    """The row of every head as the strips were drawn from it: `[H, T]`."""
    rows = driver.execute_script(
        "return Array.from(document.querySelectorAll('#strips tr.head')).map((r) => Array.from(r.values))")
    return np.asarray(rows, dtype=np.float64)


def outside_requests(driver) -> list[str]:
    events = [json.loads(entry["message"])["message"] for entry in driver.get_log("performance")]
    urls = [event["params"]["request"]["url"] for event in events if event["method"] == "Network.requestWillBeSent"]
    assert urls
    return [url for url in urls if not url.startswith(("http://127.0.0.1:", "file:", "data:", "blob:"))]


def severe(driver) -> list:
    return [entry for entry in driver.get_log("browser") if entry["level"] in ("SEVERE", "WARNING")]


def check_clicks(driver, codes, layer: int, queries, tolerance: float) -> None:
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element("id", "layer")).select_by_value(str(layer))
    compact = CodeFile(codes).compact
    for query in queries:
        click_token(driver, query)
        assert driver.execute_script("return document.body.dataset.drawnLayer") == str(layer)
        expected = compact.rows(layer, [query], np.asarray([0]))[0, :, 0]  # [H, T]
        np.testing.assert_allclose(drawn_rows(driver), expected, atol=tolerance, rtol=0)


def test_served_clicking_a_token_draws_every_heads_row_of_the_layer(browser, served, tiny):
    open_view(browser, served.url)
    check_clicks(browser, tiny, 1, [47, 5, 20], 1e-6)  # served rows are the float32 rows themselves
    check_clicks(browser, tiny, 0, [0, 31], 1e-6)
    assert severe(browser) == []
    assert outside_requests(browser) == []


def hover_token(driver, position: int) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    span = driver.find_element("css selector", f"#tokens span[data-pos='{position}']")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", span)
    ActionChains(driver).move_to_element(span).perform()


def wait_drawn(driver, position: int) -> None:
    for _ in range(300):
        if driver.execute_script("return document.body.dataset.drawnQuery") == str(position):
            return
        time.sleep(0.02)
    raise AssertionError(f"token {position} was not drawn as the query: {driver.get_log('browser')}")


def row_requests(driver) -> list[str]:
    events = [json.loads(entry["message"])["message"] for entry in driver.get_log("performance")]
    return [event["params"]["request"]["url"] for event in events
            if event["method"] == "Network.requestWillBeSent" and "/rows?" in event["params"]["request"]["url"]]


def test_hovering_a_token_previews_it_as_the_query_and_a_click_pins_it(browser, served, tiny):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    compact = CodeFile(tiny).compact
    open_view(browser, served.url)
    layer = int(browser.execute_script("return window.tokenView.state.layer"))
    assert browser.execute_script("return document.body.dataset.pinned") == "false"
    # Hover: the token under the mouse becomes the query, its rows those of the compact store.
    hover_token(browser, 20)
    wait_drawn(browser, 20)
    np.testing.assert_allclose(drawn_rows(browser), compact.rows(layer, [20], np.asarray([0]))[0, :, 0],
                               atol=1e-6, rtol=0)
    # A sweep over 25 tokens without resting asks the server for one row, the last one's.
    browser.get_log("performance")
    previews = browser.execute_script("""
        const before = window.tokenView.previews;
        for (let p = 10; p < 35; p++) {
          const span = document.querySelector(`#tokens span[data-pos='${p}']`), box = span.getBoundingClientRect();
          span.dispatchEvent(new MouseEvent('mousemove', {bubbles: true, clientX: box.x + 1, clientY: box.y + 1}));
        }
        return before;""")
    wait_drawn(browser, 34)
    time.sleep(0.3)
    assert browser.execute_script("return window.tokenView.previews") == previews + 1
    assert [url.split("query=")[1] for url in row_requests(browser)] == ["34"]
    # A click pins the query: hovering another token then shows that key's code, the query stays.
    click_token(browser, 30)
    assert browser.execute_script("return document.body.dataset.pinned") == "true"
    hover_token(browser, 12)
    time.sleep(0.4)
    assert browser.execute_script("return document.body.dataset.drawnQuery") == "30"
    tip = browser.find_element("id", "tooltip").text
    expected = compact.rows(layer, [30], np.asarray([0]))[0, 0, 0, 12]
    assert f"h0: {expected:.3f}" in tip, tip
    # Esc unpins: hover previews again.
    ActionChains(browser).send_keys(Keys.ESCAPE).perform()
    assert browser.execute_script("return document.body.dataset.pinned") == "false"
    hover_token(browser, 14)
    wait_drawn(browser, 14)
    assert severe(browser) == []
    assert outside_requests(browser) == []


def test_a_script_token_is_shown_as_text(browser, served, tiny):
    open_view(browser, served.url)
    span = browser.find_element("css selector", "#tokens span[data-pos='3']")
    assert span.text == SCRIPT
    assert browser.execute_script("return document.querySelectorAll('#tokens script, #tokens *:not(span)').length") == 0
    assert severe(browser) == []  # alert() never ran: an alert would fail the next command


def test_the_pair_relations_are_those_of_the_token_ids(browser, served, tiny):
    ids = CodeFile(tiny).extra("token_ids")[0]
    query = next(q for q in range(2, len(ids)) if ids[q] in ids[: q - 1])
    earlier = int(np.flatnonzero(ids[:query] == ids[query])[0])
    for key, expected in ((query - 1, {"previous"}), (earlier, {"duplicate"}), (earlier + 1, {"induction"}),
                          (0, {"sink"}), (query, {"self"})):
        names = set()
        names |= {"self"} if key == query else set()
        names |= {"previous"} if key == query - 1 else set()
        names |= {"duplicate"} if key < query and ids[key] == ids[query] else set()
        names |= {"induction"} if 1 <= key <= query and ids[key - 1] == ids[query] else set()
        names |= {"sink"} if key == 0 else set()
        assert expected <= names
        open_view(browser, f"{served.url}#query={query}&key={key}&layer=1&head=0")
        shown = browser.find_element("id", "pair-relations").text
        assert set(shown.split(", ")) == names, (query, key, shown)


def test_a_static_page_embeds_a_bounded_selection_and_draws_it_offline(browser, tiny, tmp_path):
    from latentcode.analysis.viewer.token_page import build_token_viewer

    page = build_token_viewer(tiny, max_queries=5).save(tmp_path / "tiny.html")
    open_view(browser, page.as_uri())
    assert "rows of 5 of 48 queries are embedded" in browser.find_element("id", "note").text
    check_clicks(browser, tiny, 1, [47, 46], TOLERANCE)
    click_token(browser, 44)  # embedded (the window before the last)
    click_token_missing = browser.find_element("css selector", "#tokens span[data-pos='20']")
    click_token_missing.click()
    time.sleep(0.3)
    assert "not in this page" in browser.find_element("id", "note").text
    assert browser.find_element("css selector", "#tokens span[data-pos='3']").text == SCRIPT
    assert severe(browser) == []
    assert outside_requests(browser) == []
    # The page's own policy refuses a request outside it.
    verdict = browser.execute_async_script("""
        const done = arguments[0];
        document.addEventListener('securitypolicyviolation', (e) => done('refused by CSP: ' + e.violatedDirective));
        fetch('https://example.org/x.js').catch(() => setTimeout(() => done('failed without a CSP report'), 500));
    """)
    assert verdict.startswith("refused by CSP: connect-src")


@pytest.mark.slow
def test_smollm2_at_2048_tokens_served_rows_equal_the_compact_store(browser, tmp_path):
    from latentcode.cli import main

    codes = tmp_path / "smol.h5"
    assert main(["extract", "smollm2", "--task", "seq_len=2048", "--n", "1", "--out", str(codes), "--quiet"]) == 0
    server = Served(codes)
    try:
        open_view(browser, server.url)
        check_clicks(browser, codes, 10, [2047, 1500, 7], 1e-6)
        check_clicks(browser, codes, 29, [1024], 1e-6)
        assert severe(browser) == []
        assert outside_requests(browser) == []
    finally:
        status, out, _ = server.stop()
    assert status == 0 and out.strip() == f"stopped serving {server.url}"
