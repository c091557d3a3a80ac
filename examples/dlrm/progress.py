"""Training progress for a terminal and for a log: a tqdm bar on a terminal, a plain line now
and then in a log.

torchx and torchrun pipe each rank's output into a log (a pipe or a file, not a terminal).
tqdm redraws its bar there as a new line on every refresh -- some 60 lines per 200 steps, most
of them saying nothing new. ``progress_bar`` keeps tqdm's bar where the output is a terminal and
otherwise prints a line only when both hold:

- at least a tenth of the run's steps (``LOG_PARTS``) went by since the last line, and
- at least ``LOG_MIN_SECONDS`` (10 s) went by since the last line,

whichever is rarer, and one last line when the run ends. A run of any length then logs at
most eleven lines, and a short one (200 steps in 20 s) not one per second.
The examples (examples/dlrm/train.py, examples/sequence/train.py) share it.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Dict, Optional, TextIO

__all__ = ["LOG_MIN_SECONDS", "LOG_PARTS", "LineProgress", "LogSchedule", "progress_bar"]

LOG_PARTS = 10
"""A log gets at most one line per this fraction (1/LOG_PARTS) of the run's steps."""
LOG_MIN_SECONDS = 10.0
"""...and at most one line per this many seconds."""


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is an interactive terminal (False for a pipe, a file, or a stream
    without ``isatty``)."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


class LogSchedule:
    """When a log gets its next line: once both a tenth of the run's steps and
    ``min_seconds`` passed since the last line (or since the start).

    Args:
        total: the step the run ends at.
        initial: the step it starts from (a resumed run: the checkpoint's).
        clock: seconds, monotonic (``time.monotonic``; tests pass a counter).
        min_seconds: least seconds between two lines.
        parts: a line per 1/parts of the run's steps at most.
    """

    def __init__(self, total: int, initial: int = 0, clock: Callable[[], float] = time.monotonic,
                 min_seconds: float = LOG_MIN_SECONDS, parts: int = LOG_PARTS) -> None:
        if parts < 1 or min_seconds < 0:
            raise ValueError(f"LogSchedule: parts must be >= 1 and min_seconds >= 0, got {parts}, {min_seconds}")
        self.total, self.clock, self.min_seconds = total, clock, min_seconds
        self.min_steps = max(1, -(-(total - initial) // parts))  # ceil: at most `parts` lines
        self.last_step, self.last_time = initial, clock()

    def due(self, step: int) -> bool:
        """Whether ``step`` gets a line; if so, the schedule counts it as printed."""
        if step - self.last_step < self.min_steps:
            return False  # the clock is read only when the steps allow a line
        now = self.clock()
        if now - self.last_time < self.min_seconds:
            return False
        self.last_step, self.last_time = step, now
        return True

    def printed_at(self, step: int) -> bool:
        """Whether the last line printed was at ``step``."""
        return self.last_step == step


class LineProgress:
    """The part of tqdm's interface the examples use (``update``, ``set_postfix``, ``close``),
    printing whole lines on ``LogSchedule``'s schedule instead of redrawing a bar.

    A line reads ``step 40/200 (20%), 3.1 step/s, 13s elapsed: loss=0.5979, qps=34,051``.
    """

    def __init__(self, total: int, initial: int = 0, disable: bool = False, stream: Optional[TextIO] = None,
                 clock: Callable[[], float] = time.monotonic, min_seconds: float = LOG_MIN_SECONDS,
                 parts: int = LOG_PARTS) -> None:
        self.total, self.initial, self.step, self.disable = total, initial, initial, disable
        self.stream = sys.stderr if stream is None else stream
        self.clock = clock
        self.schedule = LogSchedule(total, initial, clock, min_seconds, parts)
        self.start = self.schedule.last_time
        self.postfix: Dict[str, object] = {}
        self.closed = False

    def update(self, n: int = 1) -> None:
        self.step += n
        if not self.disable and self.schedule.due(self.step):
            self._print(self.schedule.last_time)

    def set_postfix(self, info: Dict[str, object], refresh: bool = True) -> None:
        """Shown on the next line (``refresh`` is accepted for tqdm's sake: a log line waits
        for its schedule)."""
        self.postfix = dict(info)

    def close(self) -> None:
        """Prints the last step reached, unless its line is out already."""
        if self.closed:
            return
        self.closed = True
        if not self.disable and self.step != self.initial and not self.schedule.printed_at(self.step):
            self._print(self.clock())

    def _print(self, now: float) -> None:
        elapsed = now - self.start
        rate = (self.step - self.initial) / elapsed if elapsed > 0 else float("nan")
        line = f"step {self.step}/{self.total} ({100 * self.step // max(1, self.total)}%), {rate:.1f} step/s, " \
               f"{elapsed:.0f}s elapsed"
        if self.postfix:
            line += ": " + ", ".join(f"{k}={v}" for k, v in self.postfix.items())
        print(line, file=self.stream, flush=True)


def progress_bar(total: int, initial: int = 0, disable: bool = False, stream: Optional[TextIO] = None,
                 clock: Callable[[], float] = time.monotonic):
    """tqdm's bar where ``stream`` (default stderr) is a terminal, else a ``LineProgress``.

    Args:
        total: the step the run ends at.
        initial: the step it starts from.
        disable: print nothing (ranks other than 0).
        stream: where progress goes (default ``sys.stderr``, tqdm's).
        clock: seconds, monotonic, for the log's schedule (tests inject a counter).
    """
    stream = sys.stderr if stream is None else stream
    if is_terminal(stream):
        from tqdm import tqdm

        return tqdm(total=total, initial=initial, disable=disable, unit="step", dynamic_ncols=True, file=stream)
    return LineProgress(total, initial, disable, stream, clock)
