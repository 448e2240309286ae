"""``python -m bench scale --quick`` (``bench/scale.py``), run in-process on its own private
redis-server: every curve of issue 29 is printed, with a row per size, and a verdict per
target. Counts only: the figures are timings and sizes of a shared machine."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from bench import scale


@pytest.fixture(scope="module")
def output() -> str:
    """What one quick run prints (one run for every test here: ~5 s)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = scale.main(["--quick"])
    assert status == 0, printed.getvalue()
    return printed.getvalue()


def table(output: str, key: str) -> list[str]:
    """The rows of curve ``key``'s table (the lines between its header and its note)."""
    match = re.search(rf"^\d\. {key}: .*?\n(.*?)\n\n", output, re.S | re.M)
    assert match is not None, f"no table for {key}"
    return [line.split()[0] for line in match.group(1).splitlines()[1:] if line[3:4] == " "]


@pytest.mark.parametrize("key", sorted(scale.SIZES))
def test_each_curve_has_a_row_per_quick_size(output: str, key: str) -> None:
    assert table(output, key) == [f"{size:,}" for size in scale.SIZES[key][0]]


def test_the_uncontended_task_is_shown_beside_the_floor(output: str) -> None:
    assert table(output, "uncontended") == ["floor", "mutex", "acks_late", "lock_limit=3", "queue"]


def test_every_target_of_issue_29_gets_a_verdict(output: str) -> None:
    verdicts = output.split("targets of issue 29", 1)[1].splitlines()[1:]
    judged = [line for line in verdicts if re.search(r": (meets|misses) \(target ", line)]
    assert len(judged) == 10
    assert "renewal round trips per tick (10 to 100 leases): 1: meets" in output
