"""Where the time per task goes, drawn from a run's own figures (matplotlib, SVG).

One horizontal bar per contender (plain Task, the floor, LockedTask, and the peers when the
run had them), stacked by stage, each stage the median over rounds of its per-round mean in
microseconds per task: *enqueue* (``apply_async``), *worker outside the body* (Celery's
tracer plus whatever the lock does around the body: acquire in ``before_start``, release
after it) and *in the task* (the no-op body and what runs inside ``__call__``). Means add up,
so the bar's length is the task's total.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence

from ._common import BenchError, median
from ._paired import Paired

#: stacked in this order: (label, how to get it from a round's stages)
STAGES = ("enqueue", "worker outside the body", "in the task")
COLOURS = ("#9ecae1", "#3182bd", "#fd8d3c")


def stage_medians(paired: Paired, key: str) -> List[float]:
    """``STAGES`` of contender ``key``: median over rounds, microseconds per task."""
    enqueue = paired.values("enqueue", key)
    worker = paired.values("worker", key)
    in_task = paired.values("in task", key)
    outside = [w - t for w, t in zip(worker, in_task)]
    return [median(enqueue), median(outside), median(in_task)]


def draw(paired: Paired, keys: Sequence[str], labels: Dict[str, str], path: Path) -> None:
    """Write the chart of ``keys`` (those the run measured) to ``path`` as SVG."""
    try:
        import matplotlib

        matplotlib.use("svg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise BenchError("the chart needs matplotlib: pip install -e '.[bench]'") from exc
    shown = [key for key in keys if key in paired.keys]
    figures = {key: stage_medians(paired, key) for key in shown}
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(shown) + 1.9))
    rows = list(range(len(shown)))[::-1]  # first contender on top
    left = [0.0] * len(shown)
    for index, (stage, colour) in enumerate(zip(STAGES, COLOURS)):
        widths = [figures[key][index] for key in shown]
        ax.barh(rows, widths, left=left, color=colour, label=stage)
        left = [a + b for a, b in zip(left, widths)]
    for row, total in zip(rows, left):
        ax.text(total, row, f" {total:.0f}", va="center", fontsize=8)
    ax.set_yticks(rows)
    ax.set_yticklabels([labels.get(key, key) for key in shown])
    ax.set_xlabel(f"microseconds per task (median of {len(paired.rounds)} rounds)")
    ax.set_title("Where the time per task goes (python -m bench fastpath)")
    # below the axes: inside, it covers the longest bar and its total
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=len(STAGES), fontsize=8)
    ax.set_xlim(0, max(left) * 1.12)  # room for the totals written after each bar
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)
