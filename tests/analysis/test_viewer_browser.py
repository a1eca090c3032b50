"""The viewer's page in a real headless browser (Debian's chromium and chromium-driver, driven by
selenium): it loads without a console error or a network request, hovering a point shows that
instance's labels, clicking it selects it, and a filter hides the other values. The page's data is
a codes file written here, so every expected label comes from the test, not from the viewer.

Skipped, with the reason, only where no browser or driver can be found (`.ci/run` installs them)."""

from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest

from latentcode.analysis.viewer import build_viewer
from latentcode.store import CodeWriter, Site

# A browser start and five loads of a 5 MB page: about 45 s on 2 busy cores; `.ci/run` runs them.
pytestmark = pytest.mark.slow

COLOURS = ["red", "green", "blue"]
N = 30
LAYERS, KEYS, HEADS, QUERY = (0, 1), range(5), 3, 4


def _browser_or_skip_reason():
    try:
        import selenium  # noqa: F401
    except ImportError:
        return None, "selenium is not installed (pip install -e '.[dev]')"
    browser = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                    if shutil.which(name)), None)
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        return None, ("no headless browser: chromium and chromedriver not found on PATH "
                      "(apt-get install chromium chromium-driver, as .ci/run does)")
    return (browser, driver), ""


def headless_chrome(*arguments: str, window: str = "1400,1100"):
    """Headless Chromium driven by selenium, with the browser and network logs on (the tests read both);
    `arguments` are added to the usual ones. Skips the test, saying why, where there is no browser."""
    found, reason = _browser_or_skip_reason()
    if found is None:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = found[0]
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--window-size={window}", *arguments):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(service=Service(found[1]), options=options)


@pytest.fixture(scope="module")
def browser():
    driver = headless_chrome()
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def colours():
    """The colour (an index into COLOURS) of each instance, as the file records it."""
    return np.random.default_rng(1).integers(0, len(COLOURS), N)


@pytest.fixture(scope="module")
def page(tmp_path_factory, colours):
    """The viewer of a small codes file: 30 train instances, label `colour` named red/green/blue,
    `size` an integer; the file's row r has size 100 + r, so a hover text names its own row."""
    directory = tmp_path_factory.mktemp("viewer")
    sites = [Site(layer, QUERY, key) for layer in LAYERS for key in KEYS]
    rng = np.random.default_rng(0)
    metadata = {"model_name": "toy", "model_config": {"attention": "toy"}, "task_config": {"name": "toy"},
                "value_names": {"colour": COLOURS}, "prediction_kind": "regression output"}
    with CodeWriter(directory / "codes.h5", sites, n_heads=HEADS, metadata=metadata) as writer:
        writer.append(codes={site: rng.random((N, HEADS)).astype(np.float32) for site in sites},
                      labels={"colour": colours, "size": 100 + np.arange(N)}, split="train",
                      prediction=np.arange(N, dtype=np.float32)[:, None] / 10, target=np.zeros(N, np.float32))
    path = build_viewer(directory / "codes.h5").save(directory / "codes.html")
    return path


def open_page(driver, url: str, frame: bool = False) -> None:
    driver.get_log("browser"), driver.get_log("performance")  # start from empty logs
    driver.get(url)
    if frame:
        driver.switch_to.frame(driver.find_element("tag name", "iframe"))
    for _ in range(300):
        if driver.execute_script("return document.body && document.body.dataset.ready") == "true":
            return
        time.sleep(0.05)
    raise AssertionError(f"the viewer at {url} did not finish drawing in 15 s: {driver.get_log('browser')}")


def points(driver):
    """The drawn points of the embedding, without the ring that marks the selected one (last trace)."""
    traces = driver.find_elements("css selector", "#embedding .scatterlayer .trace")
    return [point for trace in traces[:-1] for point in trace.find_elements("css selector", "path.point")]


def hover(driver, point) -> str:
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(driver).move_to_element(point).perform()
    for _ in range(40):
        text = driver.execute_script(
            "const e = document.querySelector('#embedding .hoverlayer .hovertext'); return e ? e.textContent : ''")
        if text:
            return text
        time.sleep(0.05)
    raise AssertionError("no hover label appeared over the point")


def row_of(hover_text: str) -> int:
    return int(hover_text.split("instance ", 1)[1].split(" ", 1)[0].split("(")[0])


def test_the_page_loads_offline_without_console_errors_or_network_requests(browser, page):
    open_page(browser, page.as_uri())
    errors = [entry for entry in browser.get_log("browser") if entry["level"] in ("SEVERE", "WARNING")]
    assert errors == []
    requests = [json.loads(entry["message"])["message"] for entry in browser.get_log("performance")]
    urls = [event["params"]["request"]["url"] for event in requests if event["method"] == "Network.requestWillBeSent"]
    assert urls and urls[0] == page.as_uri()
    assert [url for url in urls if not url.startswith(("file:", "data:", "blob:"))] == []
    # The page's own policy refuses any request: a fetch is stopped by the CSP, not by the network.
    verdict = browser.execute_async_script("""
        const done = arguments[0];
        document.addEventListener('securitypolicyviolation', (e) => done('refused by CSP: ' + e.violatedDirective));
        fetch('https://example.org/x.js').catch(() => setTimeout(() => done('failed without a CSP report'), 500));
    """)
    assert verdict.startswith("refused by CSP: connect-src")
    assert len(points(browser)) == N


def test_hovering_a_point_shows_its_instance_labels_and_answer(browser, page, colours):
    open_page(browser, page.as_uri())
    for point in points(browser)[:3]:
        text = hover(browser, point)
        row = row_of(text)
        assert f"colour: {COLOURS[colours[row]]}" in text
        assert f"size: {100 + row}" in text
        assert f"model's answer: {row / 10:.3g}" in text


def test_clicking_a_point_selects_its_instance_in_the_panel(browser, page, colours):
    open_page(browser, page.as_uri())
    assert browser.find_element("id", "instance").get_attribute("data-row") == "0"
    target = next(point for point in points(browser) if row_of(hover(browser, point)) != 0)
    from selenium.webdriver.common.action_chains import ActionChains

    row = row_of(hover(browser, target))
    ActionChains(browser).move_to_element(target).click().perform()  # a mouse click where the point is drawn
    panel = browser.find_element("id", "instance")
    assert panel.get_attribute("data-row") == str(row)
    assert f"instance {row}" in panel.text and COLOURS[colours[row]] in panel.text and str(100 + row) in panel.text
    assert f"instance {row}" in browser.find_element("id", "attention").text  # the attention panel follows


def test_filtering_by_a_label_value_hides_the_other_values(browser, page, colours):
    from selenium.webdriver.support.ui import Select

    open_page(browser, page.as_uri())
    Select(browser.find_element("id", "filter-label")).select_by_value("colour")
    Select(browser.find_element("id", "filter-value")).select_by_value("green")
    shown = points(browser)
    assert len(shown) == int((colours == COLOURS.index("green")).sum()) < N
    for point in shown[:5]:
        assert "colour: green" in hover(browser, point)
    assert browser.find_element("id", "shown-count").text == str(len(shown))


def test_the_notebook_display_renders_the_same_page_offline(browser, page, tmp_path):
    from latentcode.analysis.viewer import Viewer

    notebook = tmp_path / "notebook.html"
    viewer = Viewer(page.read_text(), "toy")
    notebook.write_text(f"<!DOCTYPE html><html><body><p>a notebook cell</p>{viewer._repr_html_()}</body></html>")
    open_page(browser, notebook.as_uri(), frame=True)
    assert len(points(browser)) == N
    browser.switch_to.default_content()
    assert [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"] == []


TOKENS = ["a", "<script>", "&amp;", "b"]  # a token is user text: shown as text, never as markup


@pytest.fixture(scope="module")
def token_page(tmp_path_factory):
    """A codes file that keeps its input tokens (`token_ids` [N, 5], names TOKENS): key 1 of every
    instance is the token "<script>", the others drawn from TOKENS."""
    directory = tmp_path_factory.mktemp("tokens")
    sites = [Site(0, QUERY, key) for key in KEYS]
    ids = np.random.default_rng(2).integers(0, len(TOKENS), (N, len(KEYS)))
    ids[:, 1] = 1
    metadata = {"model_name": "toy", "model_config": {"attention": "toy"}, "task_config": {"name": "toy"},
                "token_names": TOKENS}
    with CodeWriter(directory / "codes.h5", sites, n_heads=HEADS, metadata=metadata) as writer:
        writer.append(codes={site: np.random.default_rng(3).random((N, HEADS)).astype(np.float32) for site in sites},
                      labels={"size": np.arange(N)}, split="train", extra={"token_ids": ids})
    return build_viewer(directory / "codes.h5").save(directory / "codes.html"), ids


def test_keys_are_named_by_their_tokens_shown_as_text(browser, token_page):
    path, ids = token_page
    open_page(browser, path.as_uri())
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    panel = browser.find_element("id", "instance")
    keys = panel.find_element("id", "key-tokens").text
    expected = [f"\u201c{TOKENS[ids[0, key]]}\u201d ({key})" for key in KEYS]  # instance 0 is selected
    assert keys.split(" ") == " ".join(expected).split(" ")
    assert "\u201c<script>\u201d (1)" in keys
    assert browser.execute_script("return document.querySelectorAll('#instance script, #instance amp').length") == 0
    assert f"\u201c{TOKENS[ids[0, QUERY]]}\u201d ({QUERY})" in panel.find_element("css selector", "td.token").text
    ticks = browser.execute_script(
        "return Array.from(document.querySelectorAll('#attention .xtick text')).map((e) => e.textContent)")
    assert ticks == expected
