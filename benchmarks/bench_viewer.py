"""Size and time to first paint of `latentcode view` pages for the fuzzy-logic demo's three
shipped models (models/fuzzy_logic-{softmax,linear,hyla}); goals: at most 10 MB, first paint
within 2 s in headless Chromium.

Each model's codes are extracted here (as the demo does: the train and ood splits, the
fixed-query variant), at the sites the viewer's attention panel reads, the last query to every key
(`*:-1:*`, 2 layers × 32 keys × 8 heads), then one page per model is written with the default cap
(1000 instances). Each page is opened `--repeats` times (after about:blank) in one headless Chromium
(Debian's chromium + chromium-driver); printed per page: its size, the browser's first contentful
paint and the moment every view is drawn (the glue's `readyMs`), both from the navigation's start,
median over the repeats. Beside them, plotly.py's own offline page of one 1000-point scatter, as
the floor of what plotly.js costs on the same machine.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/bench_viewer.py [--n 2048] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from latentcode.analysis.viewer import DEFAULT_MAX_INSTANCES, build_viewer
from latentcode.extraction import extract
from latentcode.shipped import shipped_run

ATTENTIONS = ("softmax", "linear", "hyla")
SITES = "*:-1:*"


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1400,1100"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def paint_times(driver, url: str) -> tuple[float, float]:
    """(first contentful paint, every view drawn), in seconds from the navigation's start."""
    driver.get("about:blank")
    driver.get(url)
    for _ in range(600):
        ready = driver.execute_script("return document.body && document.body.dataset.readyMs")
        if ready:
            break
        time.sleep(0.05)
    else:
        raise RuntimeError(f"{url} did not finish drawing in 30 s")
    paint = driver.execute_script(
        "const e = performance.getEntriesByName('first-contentful-paint')[0]; return e ? e.startTime : null")
    return (paint or float("nan")) / 1000, float(ready) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2048, help="instances per split extracted (default 2048)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{platform.node()}: {os.cpu_count()} cores, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}; "
          f"sites {SITES}, {args.n} instances per split (train, ood), cap {DEFAULT_MAX_INSTANCES}")
    with tempfile.TemporaryDirectory() as directory:
        pages = {}
        for attention in ATTENTIONS:
            run = shipped_run("fuzzy_logic", attention)
            codes = Path(directory) / f"fuzzy_logic-{attention}.h5"
            for index, split in enumerate(("train", "ood")):
                extract(run, sites=SITES, split=split, n=args.n, out=codes, variant="fixed_query",
                        append=index > 0, progress=False)
            started = time.perf_counter()
            pages[attention] = build_viewer(codes).save(Path(directory) / f"fuzzy_logic-{attention}.html")
            print(f"{attention}: page written in {time.perf_counter() - started:.1f} s")
        # The reference: plotly's own offline page (plotly.js inline) of one 1000-point scatter, i.e.
        # what loading plotly.js and drawing one plot costs on this machine.
        import numpy as np
        import plotly.graph_objects as go

        rng = np.random.default_rng(0)
        reference = Path(directory) / "plotly-scatter.html"
        go.Figure(go.Scatter(x=rng.normal(size=1000), y=rng.normal(size=1000), mode="markers")).write_html(
            reference, include_plotlyjs=True, post_script="document.body.dataset.readyMs = performance.now();")
        pages["plotly.py reference (1 scatter)"] = reference
        driver = browser()
        try:
            print(f"{'page':34} {'size MB':>8} {'first paint s':>14} {'all drawn s':>12}   (goals: 10 MB, 2 s)")
            for attention, page in pages.items():
                times = [paint_times(driver, page.as_uri()) for _ in range(args.repeats)]
                paint = statistics.median(t[0] for t in times)
                drawn = statistics.median(t[1] for t in times)
                print(f"{attention:34} {page.stat().st_size / 1e6:8.2f} {paint:14.2f} {drawn:12.2f}")
        finally:
            driver.quit()


if __name__ == "__main__":
    main()
