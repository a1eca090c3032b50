"""A real Jupyter check of the viewer: examples/viewer_in_a_notebook.ipynb is executed in a Jupyter
kernel (nbclient), exported to HTML with nbconvert's default template, and the export is opened in
headless Chromium with the network blocked. Inside the notebook's output the viewer must render as
the browser tests ask of the page itself: no console error of its own, no network request of its
own, hovering a point shows that instance's labels, clicking selects it, a filter hides the rest.

nbconvert, nbclient and ipykernel are not dependencies of latentcode: run this where they are
installed, e.g. in a venv beside the package's environment:

    python -m venv --system-site-packages .jupyter-venv
    .jupyter-venv/bin/pip install nbconvert nbclient ipykernel
    .jupyter-venv/bin/python -m pytest -m slow tests/analysis/test_viewer_notebook.py

Elsewhere it is skipped, with that reason."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.analysis.test_viewer_browser import browser, hover, open_page, points, row_of  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "viewer_in_a_notebook.ipynb"
SHOWN = 300  # the notebook's max_instances
# nbconvert's own template asks for these two scripts from a CDN (MathJax and require.js); with the
# network blocked they fail, and they are the page's, not the viewer's: nothing else may be requested.
TEMPLATE_SCRIPTS = ("cdnjs.cloudflare.com/ajax/libs/require.js", "cdnjs.cloudflare.com/ajax/libs/mathjax")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The notebook, executed in a kernel that imports this tree's latentcode, exported to HTML;
    with the codes file it made (the notebook prints the viewer)."""
    missing = [name for name in ("nbconvert", "nbclient", "ipykernel") if _missing(name)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: the notebook check runs where Jupyter is (see this "
                    "module's docstring: a venv with nbconvert nbclient ipykernel)")
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    directory = tmp_path_factory.mktemp("notebook")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", str(ROOT))  # the kernel imports this tree, as `python -m pytest` does
        patch.setenv("OMP_NUM_THREADS", "1")
        NotebookClient(notebook, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": str(directory)}}).execute()
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [output for output in outputs if output.output_type == "error"]
    printed = "".join(output.get("text", "") for output in outputs if output.output_type == "stream")
    assert re.search(r"Viewer\('hyla · fuzzy_logic-hyla.h5 · all splits", printed), printed
    displayed = [output for output in outputs if "text/html" in output.get("data", {})]
    assert len(displayed) == 1 and "<iframe srcdoc=" in displayed[0]["data"]["text/html"]
    body, _ = HTMLExporter().from_notebook_node(notebook)
    page = directory / "notebook.html"
    page.write_text(body, encoding="utf-8")
    return page


def _missing(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is None


def test_the_exported_notebook_renders_the_viewer_offline(browser, exported):  # noqa: F811
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["http://*", "https://*", "ws://*", "wss://*"]})
    open_page(browser, exported.as_uri(), frame=True)  # waits for the viewer inside the output's iframe
    assert len(points(browser)) == SHOWN

    browser.switch_to.default_content()
    logs = browser.get_log("browser")
    events = [json.loads(entry["message"])["message"] for entry in browser.get_log("performance")]
    requested = [event["params"]["request"]["url"] for event in events if event["method"] == "Network.requestWillBeSent"]
    outside = [url for url in requested if not url.startswith(("file:", "data:", "blob:", "about:"))]
    assert all(any(script in url for script in TEMPLATE_SCRIPTS) for url in outside), outside
    errors = [entry["message"] for entry in logs if entry["level"] == "SEVERE"
              and not any(script in entry["message"] for script in TEMPLATE_SCRIPTS)]
    assert errors == [], "the only errors are the blocked template scripts'"

    browser.switch_to.frame(browser.find_element("tag name", "iframe"))
    # hover: the instance's own labels (its answer and target, as the codes file records them)
    first = points(browser)[0]
    text = hover(browser, first)
    assert "model's answer: " in text and "target: " in text and "instance " in text
    # click: the panel shows the clicked instance
    target = next(point for point in points(browser)[1:] if row_of(hover(browser, point)) != 0)
    row = row_of(hover(browser, target))
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import Select

    ActionChains(browser).move_to_element(target).click().perform()
    assert browser.find_element("id", "instance").get_attribute("data-row") == str(row)
    # filter: one value of the first label that can be filtered by hides the others
    labels = Select(browser.find_element("id", "filter-label"))
    name = labels.options[1].get_attribute("value")
    labels.select_by_value(name)
    value = Select(browser.find_element("id", "filter-value")).options[1].get_attribute("value")
    Select(browser.find_element("id", "filter-value")).select_by_value(value)
    shown = points(browser)
    assert 0 < len(shown) < SHOWN and browser.find_element("id", "shown-count").text == str(len(shown))
    for point in shown[:3]:
        assert f"{name}: {value}" in hover(browser, point)
    browser.switch_to.default_content()
