"""examples/dlrm/progress.py: a tqdm bar on a terminal, a line per tenth of the run and 10 s
in a log. The clock is a counter the test moves; nothing sleeps."""

from __future__ import annotations

import io

import pytest

from tests.support.paths import add_example_to_path

add_example_to_path()
from progress import LOG_MIN_SECONDS, LineProgress, LogSchedule, progress_bar  # noqa: E402


class _Clock:
    """A clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(total: int, seconds_per_step: float, initial: int = 0) -> list:
    """The lines a log gets over a run whose steps take ``seconds_per_step`` each."""
    clock, out = _Clock(), io.StringIO()
    bar = progress_bar(total, initial=initial, stream=out, clock=clock)
    assert isinstance(bar, LineProgress)
    for step in range(initial + 1, total + 1):
        clock.now += seconds_per_step
        bar.set_postfix({"loss": f"{1.0 / step:.4f}"})
        bar.update(1)
    bar.close()
    return out.getvalue().splitlines()


def test_log_gets_a_line_per_tenth_when_steps_are_slow() -> None:
    # 200 steps of 1 s: a tenth (20 steps, 20 s) is rarer than 10 s.
    lines = _run(200, 1.0)
    assert [line.split(" (")[0] for line in lines] == [f"step {s}/200" for s in range(20, 201, 20)]
    assert lines[0] == "step 20/200 (10%), 1.0 step/s, 20s elapsed: loss=0.0500"


def test_log_gets_a_line_per_ten_seconds_when_steps_are_fast() -> None:
    # 200 steps of 1/8 s: 10 s (80 steps) is rarer than a tenth; the end gets its line.
    lines = _run(200, 0.125)
    assert [line.split(" (")[0] for line in lines] == ["step 80/200", "step 160/200", "step 200/200"]
    assert "8.0 step/s" in lines[0]


def test_log_of_a_run_shorter_than_the_interval_gets_the_last_line_only() -> None:
    assert [line.split(" (")[0] for line in _run(30, 0.01)] == ["step 30/30"]


def test_resumed_run_counts_its_tenths_from_where_it_starts() -> None:
    # From step 100 to 200 at 2 s a step: a tenth of the 100 steps left is 10 steps, 20 s.
    lines = _run(200, 2.0, initial=100)
    assert [line.split(" (")[0] for line in lines] == [f"step {s}/200" for s in range(110, 201, 10)]


def test_log_lines_never_come_closer_than_the_interval() -> None:
    clock = _Clock()
    schedule = LogSchedule(1000, clock=clock)
    printed = []
    for step in range(1, 1001):
        clock.now += 0.5 if step < 500 else 3.0  # fast then slow
        if schedule.due(step):
            printed.append((step, clock.now))
    gaps = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(printed, printed[1:])]
    assert all(steps >= 100 and seconds >= LOG_MIN_SECONDS for steps, seconds in gaps)
    assert len(printed) <= 10


def test_disabled_rank_prints_nothing() -> None:
    out = io.StringIO()
    bar = progress_bar(10, disable=True, stream=out, clock=_Clock())
    for _ in range(10):
        bar.update(1)
    bar.close()
    assert out.getvalue() == ""


def test_terminal_keeps_the_tqdm_bar() -> None:
    from tqdm import tqdm

    out = _Terminal()
    bar = progress_bar(5, stream=out)
    assert isinstance(bar, tqdm)
    bar.update(5)
    bar.close()
    assert "5/5" in out.getvalue()


@pytest.mark.parametrize("stream", [io.StringIO(), object()])
def test_a_stream_that_is_not_a_terminal_gets_lines(stream) -> None:
    assert isinstance(progress_bar(5, stream=stream, clock=_Clock()), LineProgress)
