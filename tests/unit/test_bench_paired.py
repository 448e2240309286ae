"""The paired timing loop every benchmark's figures rest on (``bench/_paired.py``)."""

from __future__ import annotations

import random
from typing import List

import pytest

from bench._paired import Cycle, Round, shuffled_orders, time_calls


def steady(cycles: int, first: float, second: float) -> List[Cycle]:
    return [[(0, first), (1, second)] for _ in range(cycles)]


def test_every_contender_runs_once_per_cycle_in_that_cycles_order_with_a_fresh_argument() -> None:
    orders = shuffled_orders(3, 20, random.Random(1))
    log: List[tuple[int, int]] = []
    calls = [lambda arg, i=i: log.append((i, arg)) for i in range(3)]

    stages = time_calls(calls, orders, first_arg=100)

    assert [i for i, _ in log] == [i for order in orders for i in order]
    assert [arg for _, arg in log] == list(range(100, 160))
    assert [[i for i, _ in cycle] for cycle in stages["wall"]] == orders


def test_a_slow_cycle_is_dropped_for_every_contender_alike() -> None:
    cycles = [*steady(9, 1.0, 2.0), [(0, 100.0), (1, 5.0)]]  # contender 0 was preempted
    measured = Round(["a", "b"])

    measured.add({"wall": cycles}, gate="wall")

    assert measured.kept["wall"] == (9, 10)
    assert measured.means["wall"] == {"a": pytest.approx(1e6), "b": pytest.approx(2e6)}


def test_the_stages_of_one_pass_drop_the_cycles_their_gate_drops() -> None:
    worker = [*steady(9, 1.0, 2.0), [(0, 100.0), (1, 2.0)]]
    in_task = [*steady(9, 0.5, 0.5), [(0, 0.6), (1, 0.6)]]  # not slow in this stage
    measured = Round(["a", "b"])

    measured.add({"worker": worker, "in task": in_task}, gate="worker")

    assert measured.means["in task"] == {"a": pytest.approx(5e5), "b": pytest.approx(5e5)}
