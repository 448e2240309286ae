"""The one paired timing loop every benchmark that times contenders uses.

Contenders alternate call by call (engine level: one acquire + release each) or task by task
(worker level: one task each, run by ONE worker) in ONE process: a *cycle* is one call of every
contender, in a fresh random order, so a shared, noisy machine slows them alike. A *round* is
``cycles`` cycles. For each round and *stage* (wall time of a call, its CPU, a task's enqueue,
its time in the worker, ...), each contender's figure is its mean over the kept cycles: a cycle
much slower than the round's median (another process took the CPU) is dropped whole, for
every contender alike. Means, not medians, so that stages add up (enqueue + worker = total)
and a chart can stack them. Over rounds: medians, IQRs and per-round ratios (same round, same
machine weather), side by side.

Benchmarks whose unit is a batch run by other processes (``queue``, ``cluster``) share the
rounds (:func:`run_rounds`, :func:`rotated`) but not the cycles.
"""

from __future__ import annotations

import gc
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from ._common import median

#: A cycle slower than this many times the round's median cycle is dropped (preemption).
SLOW_CYCLE = 1.5

#: One call of a contender: takes a number never used before in the run (the task's argument,
#: so no two tasks share a lock); what it returns is ignored.
Call = Callable[[int], Any]
#: One timed call: (contender index, seconds).
Sample = Tuple[int, float]
#: One cycle: a sample of every contender, in the order they ran.
Cycle = List[Sample]

T = TypeVar("T")


def shuffled_orders(contenders: int, cycles: int, rng: random.Random) -> List[List[int]]:
    """The order of the contenders in each cycle: a fresh random permutation per cycle."""
    return [rng.sample(range(contenders), contenders) for _ in range(cycles)]


def time_calls(
    calls: Sequence[Call], orders: Sequence[Sequence[int]], first_arg: int = 0
) -> Dict[str, List[Cycle]]:
    """Run ``calls[i](arg)`` for each ``i`` of each order, timing every call alone.

    Returns the stages ``wall`` (``perf_counter``) and ``cpu`` (``process_time``: this
    process, the work a call does on the client side). GC is paused while timing, as timeit
    does, so a collection does not land on whichever contender happens to trigger it.
    """
    wall: List[Cycle] = []
    cpu: List[Cycle] = []
    clock, cpu_clock = time.perf_counter, time.process_time
    arg = first_arg
    gc.collect()
    gc.disable()
    try:
        for order in orders:
            wall_cycle: Cycle = []
            cpu_cycle: Cycle = []
            for index in order:
                cpu_start, start = cpu_clock(), clock()
                calls[index](arg)
                end, cpu_end = clock(), cpu_clock()
                wall_cycle.append((index, end - start))
                cpu_cycle.append((index, cpu_end - cpu_start))
                arg += 1
            wall.append(wall_cycle)
            cpu.append(cpu_cycle)
    finally:
        gc.enable()
    return {"wall": wall, "cpu": cpu}


def kept_cycles(cycles: Sequence[Cycle]) -> List[bool]:
    """Which cycles to keep: those no slower than ``SLOW_CYCLE`` x the median cycle."""
    totals = [sum(seconds for _, seconds in cycle) for cycle in cycles]
    limit = SLOW_CYCLE * median(totals)
    return [total <= limit for total in totals]


@dataclass
class Round:
    """The stages of one round: per contender, microseconds per call (mean, kept cycles)."""

    keys: List[str]
    #: stage -> contender key -> mean microseconds per call over the kept cycles
    means: Dict[str, Dict[str, float]] = field(default_factory=dict)
    #: stage -> (cycles kept, cycles)
    kept: Dict[str, Tuple[int, int]] = field(default_factory=dict)
    #: what else a level records of the round (requests sent, tasks out of order, ...)
    notes: Dict[str, Any] = field(default_factory=dict)

    def add(self, stages: Dict[str, List[Cycle]], gate: str) -> None:
        """Add stages measured in one pass; the cycles dropped are those slow in ``gate``,
        the same for every stage of the pass (a breakdown of a call still adds up)."""
        keep = kept_cycles(stages[gate])
        for stage, cycles in stages.items():
            sums = [0.0] * len(self.keys)
            counts = [0] * len(self.keys)
            for cycle, kept in zip(cycles, keep):
                if kept:
                    for index, seconds in cycle:
                        sums[index] += seconds
                        counts[index] += 1
            self.means[stage] = {
                key: sums[i] / counts[i] * 1e6 if counts[i] else math.nan
                for i, key in enumerate(self.keys)
            }
            self.kept[stage] = (sum(keep), len(keep))

    def derive(self, stage: str, parts: Sequence[str]) -> None:
        """A stage that is the sum of others (means add up: enqueue + worker = total)."""
        self.means[stage] = {key: sum(self.means[p][key] for p in parts) for key in self.keys}
        self.kept[stage] = self.kept[parts[0]]


@dataclass
class Paired:
    """Rounds of one paired run, and the figures over them."""

    keys: List[str]
    rounds: List[Round] = field(default_factory=list)
    stopped_early: str = ""

    def values(self, stage: str, key: str) -> List[float]:
        """Microseconds per call of ``key`` in ``stage``, one per round."""
        return [r.means[stage][key] for r in self.rounds]

    def ratios(self, stage: str, num: str, den: str) -> List[float]:
        """``num`` / ``den`` in ``stage``, per round (same round, same machine weather)."""
        return [r.means[stage][num] / r.means[stage][den] for r in self.rounds]

    def differences(self, stage: str, key: str, base: str) -> List[float]:
        """Microseconds ``key`` adds to ``base`` in ``stage``, per round."""
        return [r.means[stage][key] - r.means[stage][base] for r in self.rounds]

    def kept(self, stage: str) -> Tuple[int, int]:
        """Cycles kept and cycles measured in ``stage``, over all rounds."""
        pairs = [r.kept[stage] for r in self.rounds]
        return sum(k for k, _ in pairs), sum(n for _, n in pairs)


def rotated(items: Sequence[T], round_no: int) -> List[T]:
    """``items`` rotated by the round number: for benchmarks that alternate whole batches."""
    shift = round_no % len(items)
    return list(items[shift:]) + list(items[:shift])


def run_rounds(
    measure: Callable[[int], T],
    rounds: int,
    *,
    budget: float = math.inf,
    started: Optional[float] = None,
    show: Optional[Callable[[int, T, float], str]] = None,
) -> Tuple[List[T], str]:
    """``measure(round_no)`` for each round; no round starts that would end past ``budget``
    seconds after ``started`` (judged by the slowest round so far). ``show`` makes the
    progress line of a round from its result and its seconds.

    Returns the results and, if the budget stopped the run, why."""
    began = time.perf_counter() if started is None else started
    results: List[T] = []
    took: List[float] = []
    for round_no in range(rounds):
        if took and time.perf_counter() - began + max(took) > budget:
            return results, (
                f"stopped after {round_no} of {rounds} rounds: another would end past the "
                f"{budget:.0f} s budget (--budget)"
            )
        start = time.perf_counter()
        results.append(measure(round_no))
        took.append(time.perf_counter() - start)
        if show is not None:
            line = show(round_no, results[-1], took[-1])
            print(f"   round {round_no + 1}/{rounds} ({took[-1]:.1f} s){line}", flush=True)
    return results, ""


def paired_calls(
    keys: Sequence[str],
    calls: Sequence[Call],
    *,
    rounds: int,
    cycles: int,
    warmup: int = 50,
    seed: int = 9,
    first_arg: int = 0,
) -> Paired:
    """Engine level: ``calls`` (one per contender of ``keys``) alternated call by call,
    ``rounds`` x ``cycles``, after ``warmup`` unmeasured cycles (connections, script cache,
    CPU caches). Stages ``wall`` and ``cpu``."""
    rng = random.Random(seed)
    time_calls(calls, shuffled_orders(len(calls), warmup, rng), first_arg)
    arg = first_arg + warmup * len(calls)

    def measure(round_no: int) -> Round:
        measured = Round(list(keys))
        start = arg + round_no * cycles * len(calls)
        orders = shuffled_orders(len(calls), cycles, rng)
        measured.add(time_calls(calls, orders, start), gate="wall")
        return measured

    results, stopped = run_rounds(measure, rounds)
    return Paired(list(keys), results, stopped)
