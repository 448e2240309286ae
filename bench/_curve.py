"""A curve of ``bench scale``: its figures by size, printed as a table, drawn as a PNG
(``--chart``, matplotlib, imported only then).

A curve whose sizes span decades is drawn on log-log axes (a flat cost is a horizontal line, a
cost linear in the size a line of slope 1); the uncontended task, three locks side by side,
as bars.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ._common import BenchError


@dataclass
class Curve:
    """One table (and one chart): a row per size, a figure per column."""

    key: str
    title: str
    size: str  # what grows (the first column)
    columns: Sequence[str]
    plotted: Sequence[str]  # the columns the chart draws, in the unit of ``y_label``
    y_label: str
    note: str
    rows: List[Tuple[int, Dict[str, float]]] = field(default_factory=list)
    labels: Dict[int, str] = field(default_factory=dict)  # a size shown as a word
    target: Optional[float] = None  # issue 29's bound on the plotted figures, drawn dashed

    def label(self, size: int) -> str:
        return self.labels.get(size, f"{size:,}")

    def at(self, size: int, column: str) -> float:
        return dict(self.rows)[size][column]

    def growth(self, column: str) -> Tuple[int, int, float]:
        """(smallest size, largest size, the figure at the largest over the smallest)."""
        (low, first), (high, last) = self.rows[0], self.rows[-1]
        return low, high, last[column] / max(first[column], 1e-9)


def shown(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) and abs(value) >= 10 else f"{value:,.2f}"


def print_curve(number: int, curve: Curve) -> None:
    print(f"\n{number}. {curve.key}: {curve.title}")
    widths = [max(len(column), 10) for column in curve.columns]
    print(f"   {curve.size:>14} " + " ".join(f"{c:>{w}}" for c, w in zip(curve.columns, widths)))
    for size, figures in curve.rows:
        cells = " ".join(f"{shown(figures[c]):>{w}}" for c, w in zip(curve.columns, widths))
        print(f"   {curve.label(size):>14} {cells}")
    print("   " + curve.note.replace("\n", "\n   "))


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise BenchError("the charts need matplotlib: pip install -e '.[bench]'") from exc
    return plt


def draw(curve: Curve, path: Path) -> None:
    """Write the chart of ``curve`` to ``path`` (PNG)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    if curve.labels:
        labels = [curve.label(size) for size, _ in curve.rows]
        values = [figures[curve.plotted[0]] for _, figures in curve.rows]
        ax.barh(labels[::-1], values[::-1], color="#3182bd")
        for row, value in enumerate(values[::-1]):
            ax.text(value, row, f" {value:.1f}", va="center", fontsize=8)
        ax.set_xlabel(curve.y_label)
        ax.set_xlim(0, max(values) * 1.2)
    else:
        sizes = [size for size, _ in curve.rows]
        for column in curve.plotted:
            ax.plot(sizes, [figures[column] for _, figures in curve.rows], "o-", label=column)
        if min(sizes) > 0:
            ax.set_xscale("log")
        else:  # 0 unrelated keys: symlog keeps it on the axis
            ax.set_xscale("symlog", linthresh=max(1, min(s for s in sizes if s > 0)))
        if curve.target is not None:
            ax.axhline(curve.target, color="#d62728", linestyle="--", label="target (issue 29)")
        ax.set_yscale("log")
        ax.set_xlabel(curve.size)
        ax.set_ylabel(curve.y_label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax.set_title(f"{curve.key}: {curve.title}\n(python -m bench scale)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
