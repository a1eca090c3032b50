"""How far a long command is, on stderr: the work announced before it starts, then a tqdm bar on a
terminal, or plain lines where stderr is a log or a pipe (a bar there is a stream of carriage returns
and escape codes), or nothing when not enabled (`--quiet`).

    progress = Progress(n_batches, "extract ood", unit="batch", enabled=not quiet)
    progress.announce("8192 instances in 32 batches of 256, 4 sites x 16 heads")
    for batch in progress.track(range(n_batches)):
        ...

Plain lines: one per step, at most one every `interval` seconds (the first and the last step always),
each with the count, the elapsed time and the time left at the rate so far, so that a log of a long
run says where it is without a line per batch of a ten-thousand-batch run.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import TextIO, TypeVar

Item = TypeVar("Item")
LINE_INTERVAL_SECONDS = 5.0


def duration(seconds: float) -> str:
    """12.3 s, 4 min 05 s, 1 h 02 min."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class Progress:
    """`total` steps of `unit` under `description`; see the module docstring.

    interactive: a bar (True) or lines (False); default: whether `stream` is a terminal.
    stream: where it goes (default: sys.stderr at construction, so a redirected stderr is honoured).
    """

    def __init__(self, total: int, description: str, unit: str = "step", enabled: bool = True,
                 interactive: bool | None = None, stream: TextIO | None = None,
                 interval: float = LINE_INTERVAL_SECONDS):
        self.total, self.description, self.unit, self.enabled = total, description, unit, enabled
        self.stream = sys.stderr if stream is None else stream
        self.interactive = _is_terminal(self.stream) if interactive is None else interactive
        self.interval, self.done, self.bar = interval, 0, None
        self.started = self.last_line = time.perf_counter()

    def announce(self, text: str) -> None:
        """One line before the work starts: what it is and how much of it there is."""
        if self.enabled:
            print(f"{self.description}: {text}", file=self.stream, flush=True)

    def start(self) -> None:
        self.started = self.last_line = time.perf_counter()
        if self.enabled and self.interactive and self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, desc=self.description, unit=self.unit, file=self.stream,
                            dynamic_ncols=True)

    def begin(self, what: str) -> None:
        """Say which step runs now: the bar's note, or a line in a log."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(f"{what} ...")
        else:
            print(f"{self.description}: {what} ...", file=self.stream, flush=True)

    def advance(self, steps: int = 1, note: str = "") -> None:
        self.done += steps
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(steps)
            if note:
                self.bar.set_postfix_str(note)
            return
        now = time.perf_counter()
        if self.done in (steps, self.total) or now - self.last_line >= self.interval:
            self.last_line = now
            elapsed = now - self.started
            left = elapsed / self.done * (self.total - self.done)
            when = (f"done in {duration(elapsed)}" if self.done >= self.total
                    else f"{duration(elapsed)} elapsed, about {duration(left)} left")
            print(f"{self.description}: {self.done}/{self.total} {_plural(self.unit)}, {when}"
                  + (f" ({note})" if note else ""), file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def track(self, items: Iterable[Item]) -> Iterator[Item]:
        """The items, advancing one step after each; closes the bar at the end (or on an error)."""
        self.start()
        try:
            for item in items:
                yield item
                self.advance()
        finally:
            self.close()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or a file-like stream without isatty
        return False


def _plural(unit: str) -> str:
    return unit + ("es" if unit.endswith(("s", "x", "ch", "sh")) else "s")
