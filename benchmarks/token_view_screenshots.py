"""Screenshots of the token view (issue 51) on SmolLM2, for the docs' SmolLM2 tutorial: repeated
random tokens (an induction head's row lighting up the token after the earlier copy of the query's
token) and natural text.

Two codes files are extracted (`latentcode.extract`, compact store): `--half` random token ids (seed 0,
ids 1000..20000) written twice, and a window of the language corpus's validation split. In the first,
the head whose rows put the most on the induction key (query i of the second copy -> key i - half + 1)
is found from the compact store, and the page opens on it (`#layer=..&head=..&query=..`). In the
natural text, the same head at the query (whose token occurred up to `--reach` tokens before) where
its code on the induction key is largest. Each page is the static token view, its pattern window the
32 queries it embeds before the query; the token box is scrolled so that the query and its top key
both show. One headless Chromium screenshot of each goes to `--out`.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/token_view_screenshots.py --out docs/assets
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
from latentcode.extraction import extract
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


def induction_queries(ids: np.ndarray, reach: int) -> tuple[np.ndarray, np.ndarray]:
    """(queries, their induction keys): each query whose token occurred at most `reach` tokens
    before, and the position after that latest earlier copy."""
    queries, keys, last_seen = [], [], {}
    for position, token in enumerate(ids.tolist()):
        earlier = last_seen.get(token)
        if earlier is not None and earlier + 1 < position and position - earlier <= reach:
            queries.append(position)
            keys.append(earlier + 1)
        last_seen[token] = position
    return np.asarray(queries), np.asarray(keys)


def screenshot(page: Path, fragment: str, out: Path) -> str:
    """The page opened at `fragment`, its token box scrolled to show the query and its key; the
    chosen pair's line as the page wrote it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=960,1200", "--host-resolver-rules=MAP * ~NOTFOUND"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        driver.get(page.as_uri() + fragment)
        for _ in range(600):
            if driver.execute_script("return document.body.dataset.ready === 'true'"):
                break
            time.sleep(0.05)
        driver.execute_script("""
            const box = document.getElementById('tokens');
            const query = box.querySelector('span.query'), key = box.querySelector('span.key') || query;
            const middle = (query.offsetTop + key.offsetTop) / 2;
            box.scrollTop = Math.max(0, middle - box.clientHeight / 2);""")
        # The whole page, at a width whose labels stay readable where the docs scale the picture down.
        inner = driver.execute_script("return [window.innerHeight, document.documentElement.scrollHeight]")
        driver.set_window_size(960, driver.get_window_size()["height"] - inner[0] + inner[1])
        time.sleep(0.5)
        driver.save_screenshot(str(out))
        return driver.find_element("id", "relations").text.splitlines()[0]
    finally:
        driver.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/assets")
    parser.add_argument("--half", type=int, default=120, help="random tokens, written twice (default 120: both copies fit the token box)")
    parser.add_argument("--text-length", type=int, default=512)
    parser.add_argument("--reach", type=int, default=100, help="natural text: at most this far back to the copy")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as directory:
        natural = extract("smollm2", {"seq_len": args.text_length}, "*:-1:-1", n=1, out=Path(directory) / "text.h5",
                          progress=False)
        original = latentcode.pretrained.corpus_token_windows
        latentcode.pretrained.corpus_token_windows = repeated_random(args.half)
        try:
            repeated = extract("smollm2", {"seq_len": 2 * args.half}, "*:-1:-1", n=1, out=Path(directory) / "rep.h5",
                               progress=False)
        finally:
            latentcode.pretrained.corpus_token_windows = original
        layer, head, score = induction_head(CodeFile(repeated), args.half)
        query = args.half + args.half // 2
        print(f"repeated random tokens ({args.half} x 2): induction head L{layer} h{head}, mean code on the "
              f"induction key {score:.3f}; query {query}, its induction key {query - args.half + 1}")
        page = build_token_viewer(repeated, query=query).save(Path(directory) / "rep.html")
        pair = screenshot(page, f"#layer={layer}&head={head}&query={query}&window=32",
                          out / "token_view_induction.png")
        print(f"  the page: {pair}")
        text = CodeFile(natural)
        queries, keys = induction_queries(text.extra("token_ids")[0], args.reach)
        rows = text.compact.rows(layer, queries, np.asarray([0]))[0, head]  # [Q, T]
        best = int(rows[np.arange(len(queries)), keys].argmax())
        query = int(queries[best])
        print(f"natural text ({args.text_length} tokens): L{layer} h{head} at query {query}, whose induction key "
              f"{int(keys[best])} gets {rows[best, keys[best]]:.3f} ({len(queries)} queries with a copy within "
              f"{args.reach} tokens)")
        page = build_token_viewer(natural, query=query).save(Path(directory) / "text.html")
        pair = screenshot(page, f"#layer={layer}&head={head}&query={query}&window=32", out / "token_view_text.png")
        print(f"  the page: {pair}")
    print(f"screenshots in {out}")


if __name__ == "__main__":
    main()
