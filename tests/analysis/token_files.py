"""Codes files for the token view's tests: a tiny random Llama's extraction (compact store, token ids
and their text, as `latentcode extract` writes them), one token renamed `<script>...` (user text,
to be shown as text), and a running `latentcode view FILE --serve` whose address is read from its
first line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py

from latentcode.cli import main
from tests.pretrained_models import save_tiny_llama

SCRIPT = "<script>alert(1)</script>"
REPOSITORY = Path(__file__).resolve().parents[2]


def tiny_token_file(directory: Path, seq_len: int = 48, n: int = 2) -> tuple[Path, Path]:
    """(the model directory, its codes file with every layer in a compact store)."""
    model = save_tiny_llama(directory / "tiny")
    codes = directory / "tiny.h5"
    assert main(["extract", str(model), "--task", f"seq_len={seq_len}", "--n", str(n), "--out", str(codes),
                 "--quiet"]) == 0
    return model, codes


def rename_token(codes: Path, token: int, text: str) -> None:
    """The file's text of token id `token` replaced by `text` (the root attribute token_names)."""
    with h5py.File(codes, "r+") as file:
        names = json.loads(file.attrs["token_names"])
        names[token] = text
        file.attrs["token_names"] = json.dumps(names)


class Served:
    """`latentcode view FILE --serve ARGS` in a subprocess; `url` from its first line."""

    def __init__(self, codes: Path, *args: str):
        # SIGINT restored to its default in the child: under a background shell job it is ignored, and
        # Python would then never turn it into KeyboardInterrupt.
        environment = {**os.environ, "PYTHONPATH": str(REPOSITORY), "OMP_NUM_THREADS": "1"}
        # As `python -m latentcode.cli`, with faulthandler on SIGUSR1: a server that does not stop says where.
        launcher = ("import faulthandler, signal, sys; faulthandler.register(signal.SIGUSR1, all_threads=True); "
                    "from latentcode.cli import main; sys.exit(main(sys.argv[1:]))")
        self.process = subprocess.Popen([sys.executable, "-c", launcher, "view", str(codes), "--serve", *args],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment,
                                        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.first_line = self.process.stdout.readline().strip()
        if not self.first_line.startswith("http://127.0.0.1:"):
            self.process.kill()
            raise AssertionError(f"no address on the first line: {self.first_line!r} {self.process.stderr.read()}")
        self.url = self.first_line

    def stop(self) -> tuple[int, str, str]:
        """Ctrl-C (SIGINT); (exit status, the rest of stdout, stderr)."""
        self.process.send_signal(signal.SIGINT)
        try:
            out, err = self.process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGUSR1)  # every thread's stack, on stderr
            time.sleep(1)
            self.process.kill()
            out, err = self.process.communicate()
            raise AssertionError(f"the server did not stop within 30 s of Ctrl-C; stdout {out!r}; stderr:\n{err}") from None
        return self.process.returncode, out, err
