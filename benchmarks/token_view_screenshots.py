"""Screenshots of the token view (issue 51) on SmolLM2: repeated random tokens (an induction head's
row lighting up the token after the earlier copy of the query's token) and natural text.

Two codes files are extracted (`extract_pretrained`, compact store): `--half` random token ids (seed 0,
ids 1000..20000) written twice, and a window of the language corpus's validation split. In the first,
the head whose rows put the most on the induction key (query i of the second copy -> key i - half + 1)
is found from the compact store, and the page opens on it (`#layer=..&head=..&query=..`). Each page is
the static token view; one headless Chromium screenshot of each goes to `--out`.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/token_view_screenshots.py --out benchmarks/results/token_view
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

import latentcode.pretrained
from latentcode.analysis.viewer.token_page import build_token_viewer
from latentcode.extraction.pretrained_extract import extract_pretrained
from latentcode.store import CodeFile


def repeated_random(half: int):
    def windows(pretrained, split, seq_len, n, seed=0, extra=0):
        tokens = np.random.default_rng(seed).integers(1000, 20000, half)
        return np.tile(np.concatenate([tokens, tokens])[None, :seq_len], (n, 1)).astype(np.int64)
    return windows


def induction_head(code_file: CodeFile, half: int) -> tuple[int, int, float]:
    """(layer, head, mean code on the induction key over the second copy's queries)."""
    compact = code_file.compact
    queries = np.arange(half + 1, 2 * half)
    best = (0, 0, -1.0)
    for layer in compact.layers:
        rows = compact.rows(layer, queries, np.asarray([0]))[0]  # [H, Q, T]
        scores = rows[:, np.arange(len(queries)), queries - half + 1].mean(axis=1)
        head = int(scores.argmax())
        if scores[head] > best[2]:
            best = (layer, head, float(scores[head]))
    return best


def screenshot(page: Path, fragment: str, out: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1400,1350", "--host-resolver-rules=MAP * ~NOTFOUND"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        driver.get(page.as_uri() + fragment)
        for _ in range(600):
            if driver.execute_script("return document.body.dataset.ready === 'true'"):
                break
            time.sleep(0.05)
        driver.execute_script("document.querySelector('#tokens span.query').scrollIntoView({block: 'center'})")
        time.sleep(0.5)
        driver.save_screenshot(str(out))
    finally:
        driver.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/token_view")
    parser.add_argument("--half", type=int, default=200, help="random tokens, written twice (default 200)")
    parser.add_argument("--text-length", type=int, default=512)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as directory:
        natural = extract_pretrained("smollm2", n=1, seq_len=args.text_length, out=Path(directory) / "text.h5",
                                     progress=False)
        original = latentcode.pretrained.corpus_token_windows
        latentcode.pretrained.corpus_token_windows = repeated_random(args.half)
        try:
            repeated = extract_pretrained("smollm2", n=1, seq_len=2 * args.half, out=Path(directory) / "rep.h5",
                                          progress=False)
        finally:
            latentcode.pretrained.corpus_token_windows = original
        layer, head, score = induction_head(CodeFile(repeated), args.half)
        query = args.half + args.half // 2
        print(f"repeated random tokens ({args.half} x 2): induction head L{layer} h{head}, mean code on the "
              f"induction key {score:.3f}; query {query}, its induction key {query - args.half + 1}")
        page = build_token_viewer(repeated, query=query).save(Path(directory) / "rep.html")
        screenshot(page, f"#layer={layer}&head={head}&window=64", out / "repeated_random_induction.png")
        page = build_token_viewer(natural).save(Path(directory) / "text.html")
        screenshot(page, f"#layer={layer}&head={head}", out / "natural_text.png")
        print(f"natural text ({args.text_length} tokens): the same head, the last query")
    print(f"screenshots in {out}")


if __name__ == "__main__":
    main()
