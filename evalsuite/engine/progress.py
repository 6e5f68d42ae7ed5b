"""Progress where no one watches a terminal: SLURM logs, nohup, CI.

tqdm draws its bar only on a terminal (`disable=None`); without one, a run would be silent
for hours. There, a line goes to stderr about every EVERY_S seconds (the environment's
EVALSUITE_PROGRESS_EVERY overrides it):

    progress: needle toy-base: 120/2,000 samples (6%), 1.93 samples/s, ETA 16 min 14 s; overall: run 1 of 4, ETA 1 h 05 min

The overall part appears when one command makes several runs (several models, a suite):
its ETA takes the share of runs done, the current one counted by its samples, as the
share of the whole (runs of one suite differ in size, so it firms up as runs finish).

`--no-progress` silences the libraries' bars too (loading weights, converting a GGUF file,
preparing a dataset): they draw with tqdm, several without a switch of their own, so tqdm's
bars are off by default for the command's runs (`overall(..., bars=False)`), and back after.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TextIO

EVERY_S = 60.0


def every_s() -> float:
    """Seconds between lines: EVALSUITE_PROGRESS_EVERY when it is a number, else EVERY_S."""
    try:
        return max(0.0, float(os.environ.get("EVALSUITE_PROGRESS_EVERY", EVERY_S)))
    except ValueError:
        return EVERY_S


def no_terminal(stream: TextIO | None = None) -> bool:
    stream = stream or sys.stderr
    isatty = getattr(stream, "isatty", None)
    return not (callable(isatty) and isatty())


@dataclass
class Overall:
    """Runs of one command: how many, how many done, since when."""

    runs: int
    done: int = 0
    started: float = field(default_factory=time.monotonic)


_overall: list[Overall] = []  # the command's runs, while one is being made (a stack: nested calls keep the outer)


@contextmanager
def overall(runs: int, bars: bool = True) -> Iterator[None]:
    """Count `runs` runs as one command's work, for the overall ETA (the outermost call counts);
    with `bars` False, no progress bar is drawn meanwhile, a library's included."""
    _overall.append(Overall(runs))
    try:
        with ExitStack() as stack:
            if not bars:
                stack.enter_context(no_bars())
            yield
    finally:
        _overall.pop()


@contextmanager
def no_bars() -> Iterator[None]:
    """Every tqdm bar created in the block is disabled unless its caller asks for it (disable=False):
    transformers' GGUF conversion, for one, draws with tqdm directly, past transformers' own switch."""
    import tqdm.std

    original = tqdm.std.tqdm.__dict__["__init__"]
    tqdm.std.tqdm.__init__ = functools.partialmethod(original, disable=True)
    try:
        yield
    finally:
        tqdm.std.tqdm.__init__ = original


def run_done() -> None:
    if _overall:
        _overall[0].done += 1


class LineProgress:
    """A line every few seconds with samples done, rate and ETA; silent on a terminal (tqdm
    draws there) or when `enabled` is False."""

    def __init__(self, label: str, total: int, enabled: bool = True, stream: TextIO | None = None,
                 every: float | None = None):
        self.label, self.total, self.done = label, total, 0
        self.stream = stream or sys.stderr
        self.enabled = enabled and total > 0 and no_terminal(self.stream)
        self.every = every_s() if every is None else every
        self.started = self.last = time.monotonic()

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and now - self.last >= self.every:
            self.last = now
            print(self.line(now), file=self.stream, flush=True)

    def line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        left = (self.total - self.done) / rate if rate > 0 else float("inf")
        text = (f"progress: {self.label}: {self.done:,}/{self.total:,} samples ({self.done / self.total:.0%}), "
                f"{rate:.3g} samples/s, ETA {eta(left)}")
        if _overall and _overall[0].runs > 1:
            text += f"; overall: {overall_text(_overall[0], self.done / self.total, now)}"
        return text

    def close(self) -> None:
        if self.enabled and self.done:
            elapsed = time.monotonic() - self.started
            print(f"progress: {self.label}: {self.done:,}/{self.total:,} samples done in {eta(elapsed)}",
                  file=self.stream, flush=True)


def overall_text(state: Overall, current: float, now: float) -> str:
    """`run i of n, ETA ...`: the share of the work done is (runs done + the current run's share) / runs."""
    share = (state.done + current) / state.runs
    elapsed = now - state.started
    left = elapsed * (1 - share) / share if share > 0 else float("inf")
    return f"run {min(state.done + 1, state.runs)} of {state.runs}, ETA {eta(left)}"


def eta(seconds: float) -> str:
    if seconds != seconds or seconds == float("inf"):
        return "unknown"
    seconds = round(max(0.0, seconds))
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"
