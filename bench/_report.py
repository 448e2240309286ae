"""What the worker-level benchmarks (``celery``, ``fastpath``, ``dedupe``) print alike: the
contenders side by side, the lock requests they sent, and verdict lines built from them."""

from __future__ import annotations

from collections import Counter
from typing import List

from ._common import distinct, med_iqr, median, verdict
from ._paired import Paired
from ._worker import Lane, sent_counts

#: Lock round trips per uncontended task: one to acquire, one to release; none at enqueue.
LOCK_ROUND_TRIPS_PER_TASK = 2


def per_task(counts: Counter[str], n: int) -> str:
    if not counts:
        return "-"
    return " + ".join(f"{count / n:g} {name}" for name, count in counts.most_common())


def print_side_by_side(paired: Paired, lane: Lane) -> None:
    """One row per contender: its figures and its per-round ratios to the plain task."""
    kept, cycles = paired.kept("worker")
    first = paired.rounds[0].notes["cycles"]
    print(
        f"\n1. per contender: {first} tasks each per round, alternated task by task in random "
        f"order within each cycle,\n   {len(paired.rounds)} rounds, {kept}/{cycles} cycles "
        "kept; median over rounds [IQR of the rounds]"
    )
    print(
        f"   {'contender':<32} {'tasks/s':>7} {'best':>5} {'x plain tasks/s':>21} "
        f"{'+us vs plain':>17} {'in task':>7} {'enqueue':>7} {'total':>6} {'CPU':>5}  "
        "lock RTs worker/enqueue"
    )
    for entry in lane.entries:
        if not entry.available:
            print(f"   {entry.label:<32} {'n/a':>7}  {entry.reason}")
            continue
        key = entry.key
        worker = paired.values("worker", key)
        faster = paired.ratios("worker", "plain", key)  # plain's time over its: tasks/s ratio
        trips = "- (no lock)"
        if entry.contender.lock_keys is not None:
            trips = distinct(sent_counts(paired, key, "worker_sent")[0])
            trips += " / " + distinct(sent_counts(paired, key, "enqueue_sent")[0])
        print(
            f"   {entry.label:<32} {1e6 / median(worker):>7.0f} {1e6 / min(worker):>5.0f} "
            f"{med_iqr(faster, '.3f'):>21} "
            f"{med_iqr(paired.differences('worker', key, 'plain'), '.0f'):>17} "
            f"{median(paired.values('in task', key)):>7.0f} "
            f"{median(paired.values('enqueue', key)):>7.0f} "
            f"{median(paired.values('total', key)):>6.0f} "
            f"{median(paired.values('cpu', key)):>5.0f}  {trips}"
        )
    print(
        "   tasks/s: 1e6 / us per task in the worker (previous task's task_postrun to its own: "
        "broker fetch, worker loop,\n   hooks, body), mean over kept cycles; best: fastest "
        "round; x plain: plain's us/task over the contender's, per\n   round; +us: what it "
        "adds to plain; then microseconds per task: in task: task_prerun..task_postrun; "
        "enqueue:\n   apply_async, no worker running; total: enqueue + worker (the cost of a "
        "task when the lock is taken at\n   enqueue time); CPU: this process over the worker "
        "time; lock RTs: requests per task from the contender's own\n   lock client (a/b: "
        "differs between rounds; health-check PINGs of an idle connection not counted)"
    )


def print_requests(paired: Paired, lane: Lane) -> None:
    """What each contender's lock client sent, per task, over all rounds."""
    tasks = sum(r.notes["cycles"] for r in paired.rounds)
    print("\n   lock requests per task (all rounds):")
    for entry in lane.usable:
        if entry.contender.lock_keys is None:
            continue
        _, worker = sent_counts(paired, entry.key, "worker_sent")
        _, enqueue = sent_counts(paired, entry.key, "enqueue_sent")
        _, upkeep = sent_counts(paired, entry.key, "upkeep_sent")
        _, outside = sent_counts(paired, entry.key, "outside_sent")
        line = f"worker: {per_task(worker, tasks)}; enqueue: {per_task(enqueue, tasks)}"
        if upkeep:
            line += f"; health-check PINGs: {sum(upkeep.values())}"
        if outside:
            line += f"; outside any task (worker start/stop): {dict(outside)}"
        print(f"   {entry.label:<32} {line}")
    out_of_order = sum(r.notes["out_of_order"] for r in paired.rounds)
    if out_of_order:
        print(f"   note: {out_of_order} tasks ran out of their enqueue order")
    if paired.stopped_early:
        print(f"   {paired.stopped_early}")


def trips_verdict(paired: Paired, lane: Lane, key: str) -> str:
    """``key`` sent exactly 2 lock requests per task in the worker and 0 at enqueue."""
    worker, _ = sent_counts(paired, key, "worker_sent")
    enqueue, _ = sent_counts(paired, key, "enqueue_sent")
    exact = all(t == LOCK_ROUND_TRIPS_PER_TASK for t in worker) and not any(enqueue)
    return (
        f"{lane.by_key()[key].label}: {distinct(worker)} lock round trips per task in the "
        f"worker, {distinct(enqueue)} at enqueue (= {LOCK_ROUND_TRIPS_PER_TASK} and 0, every "
        f"round) {verdict(exact)}"
    )


def ahead_of(paired: Paired, ours: str, other: str, stage: str) -> List[float]:
    """Per round, ``other``'s time over ``ours`` in ``stage``: > 1 when ours is faster."""
    return paired.ratios(stage, other, ours)


def print_verdicts(lines: List[str]) -> None:
    print("\nverdicts:")
    for line in lines:
        print(f"   {line}")
