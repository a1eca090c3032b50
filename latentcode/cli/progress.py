"""How far a long command is, on stderr: a tqdm bar on a terminal, plain lines elsewhere (a line per
step, and one per tenth of the work, so a log shows it moving without carriage returns), nothing
when not `enabled` (--quiet)."""

from __future__ import annotations

import sys
import time


class Progress:
    """`step(text)` says what starts; `advance(amount)` counts work done out of `total` (an estimate:
    the bar may stop short of it or pass it)."""

    def __init__(self, enabled: bool, total: int, what: str, unit: str = "examples"):
        self.enabled, self.total, self.what, self.unit = enabled, max(1, int(total)), what, unit
        self.done, self.tenths, self.started = 0, 0, time.perf_counter()
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, desc=what, unit=unit, unit_scale=True)

    def _line(self, text: str) -> None:
        print(f"{self.what}: {text} ({time.perf_counter() - self.started:.0f} s)", file=sys.stderr, flush=True)

    def step(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(text[:60])
        elif self.enabled:
            self._line(text)

    def advance(self, amount: int) -> None:
        self.done += int(amount)
        if self.bar is not None:
            self.bar.update(int(amount))
        elif self.enabled and self.done * 10 // self.total > self.tenths:
            self.tenths = min(10, self.done * 10 // self.total)
            self._line(f"{self.done:,} of about {self.total:,} {self.unit}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
