"""What ``python -m bench instructions`` (``bench/instructions.py``) computes from callgrind's
output.

The benchmark itself runs ten processes under valgrind (~2-3 min): never from the test suite.
"""

from __future__ import annotations

import pytest

from bench import instructions
from bench._common import BenchError
from bench.instructions import Run, collected, per_task

CALLGRIND_STDERR = """\
==4242== Callgrind, a call-graph generating cache profiler
==4242== Command: /usr/bin/python3 -m bench._tracer plain - 200 redis://127.0.0.1:1/0 bench-x
==4242==
==4242== Events    : Ir
==4242== Collected : 1805211509
==4242==
==4242== I   refs:      1,805,211,509
"""


def test_the_total_is_read_from_callgrinds_collected_line() -> None:
    assert collected(CALLGRIND_STDERR) == 1805211509


def test_output_without_a_collected_line_is_a_bench_error() -> None:
    with pytest.raises(BenchError):
        collected("tracer FAILED: plain task 3: FAILURE\n")


def test_a_collected_line_printed_by_the_program_itself_is_not_taken_for_callgrinds() -> None:
    with pytest.raises(BenchError):
        collected("Collected : 12\n")


def test_per_task_is_the_difference_of_two_runs_over_their_difference_in_tasks() -> None:
    low, high = Run(tasks=200, ir=1_800_000_000), Run(tasks=1000, ir=2_200_000_000)

    assert per_task(low, high) == 500_000.0


def test_the_long_run_must_have_more_tasks_than_the_short_one() -> None:
    with pytest.raises(ValueError):
        per_task(Run(tasks=1000, ir=2), Run(tasks=200, ir=1))


def test_without_valgrind_the_benchmark_says_na_and_exits_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)

    assert instructions.main([]) == 0
    assert "n/a: valgrind not found (Debian package valgrind)" in capsys.readouterr().out


PER_TASK = {"plain": 190e3, "floor": 320e3, "locked": 440e3, "fstring": 430e3, "no-engine": 270e3}


def test_the_summary_says_there_is_no_target() -> None:
    lines = instructions.report(PER_TASK, 200, 1000)

    assert any("informational: no target" in line for line in lines)


def test_the_summary_gives_lockedtasks_excess_over_the_floor() -> None:
    lines = instructions.report(PER_TASK, 200, 1000)

    assert any("+120.0k over the floor's 320.0k (1.375x)" in line for line in lines)
