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

The token view (issue 51; goals: a clicked token's rows drawn within 200 ms at T = 2,048 and 8,192,
a static page of T = 2,048 at most 10 MB): `--tokens FILE ...`, codes files of a language model with a
compact store (e.g. `latentcode extract smollm2 --task seq_len=8192 --n 1 --out smol8192.h5`). Per
file: the static page's size and build time; `latentcode view FILE --serve` started as its own
process, one headless Chromium clicking `--clicks` tokens drawn at random (seed 0) in layer 15, and
the page's own figure for each, from the click event to the end of the frame that shows every head's
row (median, 90th percentile, max; the first click, before any row was read, apart; each click once
the page is idle: the previous click's overview drawn), with the median of its parts (rows read,
text coloured, strips drawn, frame rendered; served, the server's own work on the row); the server's
resident memory after them, now and at its peak (VmRSS, VmHWM); the same clicks on the static page
(embedded tokens only). The load average is printed beside the figures.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/bench_viewer.py --tokens smol2048.h5 smol8192.h5 \
        [--static-max-len 2048]   # no static page of the longer files (its build takes minutes)
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


def click_times(driver, url: str, positions, layer: int) -> list[dict]:
    """Per click, the page's own figures (`tokenView.timings`, ms): `ms` from the click event to the
    frame after the row is drawn, and its parts: `rows` (the rows read, from the server or the page),
    `text` (the tokens coloured), `strips` (every head's strip and the pair), `frame` (that frame
    rendered); served, `server` (the server's work on the row, its Server-Timing header)."""
    from selenium.webdriver.support.ui import Select

    driver.get("about:blank")
    driver.get(url)
    wait_for(driver, "return document.body && document.body.dataset.ready === 'true'")
    Select(driver.find_element("id", "layer")).select_by_value(str(layer))
    times = []
    for position in positions:
        driver.execute_script("document.body.dataset.drawnQuery = '';"
                              "document.querySelector(`#tokens span[data-pos='${arguments[0]}']`).click()", position)
        wait_for(driver, f"return document.body.dataset.drawnQuery === '{position}'")
        timing = driver.execute_script("""
            const t = window.tokenView.timings[window.tokenView.timings.length - 1];
            const rows = performance.getEntriesByType('resource').filter((e) => e.name.includes('/rows?'));
            const last = rows[rows.length - 1];
            performance.clearResourceTimings();
            return Object.assign({}, t, {server: last && last.serverTiming.length ? last.serverTiming[0].duration : null});
        """)
        times.append(timing)
        # The next click once the page is idle (its overview drawn), as a reader's next click would be.
        wait_for(driver, f"return document.body.dataset.overviewQuery === '{position}'")
    return times


def wait_for(driver, script: str, seconds: float = 60) -> None:
    for _ in range(int(seconds / 0.01)):
        if driver.execute_script(script):
            return
        time.sleep(0.01)
    raise RuntimeError(f"waited {seconds} s for {script}")


def memory_mb(pid: int, field: str) -> float:
    """A process's resident memory: VmRSS (now) or VmHWM (its peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def summary(timings: list[dict]) -> str:
    """The click-to-drawn figures (the first click apart), then the median of each part."""
    import numpy as np

    times = [t["ms"] for t in timings]
    parts = ["rows", "text", "strips", "frame"] + (["server"] if timings[-1].get("server") is not None else [])
    medians = "  ".join(f"{part} {np.median([t[part] for t in timings[1:]]):.1f}" for part in parts)
    return (f"first {times[0]:7.1f}  then median {np.median(times[1:]):7.1f}  p90 {np.percentile(times[1:], 90):7.1f}"
            f"  max {max(times[1:]):7.1f} ms (n={len(times) - 1}); median parts, ms: {medians}; load "
            f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def token_view(files: list[str], clicks: int, layer: int, static_max_len: int | None = None) -> None:
    import signal
    import subprocess
    import sys

    import numpy as np

    from latentcode.store import CodeFile

    print(f"{platform.node()}: {os.cpu_count()} cores, load {os.getloadavg()}, token view, layer {layer}, "
          f"{clicks} clicks at random tokens (seed 0); goals: <= 200 ms click to rows drawn, <= 10 MB static page")
    driver = browser()
    try:
        for path in files:
            code_file = CodeFile(path)
            length = code_file.compact.seq_len
            if static_max_len is None or length <= static_max_len:
                static_page(driver, code_file, length, clicks, layer)
            environment = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
            server = subprocess.Popen([sys.executable, "-m", "latentcode.cli", "view", path, "--serve"],
                                      stdout=subprocess.PIPE, text=True, env=environment,
                                      # SIGINT as a terminal's Ctrl-C, even where this script runs in the
                                      # background (a shell's background job ignores SIGINT, and its children)
                                      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
            try:
                url = server.stdout.readline().strip()
                positions = np.random.default_rng(0).integers(0, length, clicks + 1).tolist()
                served = click_times(driver, url, positions, layer)
                print(f"T={length}: served, click to rows drawn: {summary(served)}")
                print(f"T={length}: server resident memory {memory_mb(server.pid, 'VmRSS'):.0f} MB now, "
                      f"{memory_mb(server.pid, 'VmHWM'):.0f} MB at its peak")
            finally:
                server.send_signal(signal.SIGINT)
                try:
                    server.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    print("the server did not stop within 120 s of SIGINT; killed")
                    server.kill()
    finally:
        driver.quit()


def static_page(driver, code_file, length: int, clicks: int, layer: int) -> None:
    import numpy as np

    from latentcode.analysis.viewer.token_page import build_token_viewer

    started = time.perf_counter()
    viewer = build_token_viewer(code_file)
    built = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as directory:
        page = viewer.save(Path(directory) / "page.html")
        embedded = sorted(int(q) for q in _embedded(page))
        print(f"T={length}: static page {page.stat().st_size / 1e6:.2f} MB, {len(embedded)} queries embedded, "
              f"built in {built:.1f} s (load {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
        rng = np.random.default_rng(0)
        static = click_times(driver, page.as_uri(), rng.choice(embedded, min(clicks, len(embedded)),
                                                               replace=False).tolist(), layer)
        print(f"T={length}: static, click to rows drawn: {summary(static)}")


def _embedded(page: Path) -> list[int]:
    import json

    text = page.read_text()
    start = text.index('id="token-data">') + len('id="token-data">')
    return json.loads(text[start : text.index("</script>", start)].replace("<\\/", "</"))["embedded"]["queries"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2048, help="instances per split extracted (default 2048)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", nargs="+", metavar="CODES.h5", help="measure the token view of these files instead")
    parser.add_argument("--clicks", type=int, default=20)
    parser.add_argument("--layer", type=int, default=15)
    parser.add_argument("--static-max-len", type=int, help="static pages only of files of at most this many tokens")
    args = parser.parse_args()
    if args.tokens:
        return token_view(args.tokens, args.clicks, args.layer, args.static_max_len)
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
