"""Figures of the chaos scenarios: printed by each test, listed again at the end of the run.

A test records its figures with the ``chaos_figures`` fixture. They are shown in a "chaos
figures" section of the terminal summary, one JSON line per scenario, and appended to the file
named by ``$CSL_CHAOS_REPORT`` when it is set (docs/explanation/reliability.md is written from
them).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

import pytest

FIGURES = pytest.StashKey[list[dict[str, Any]]]()


@pytest.fixture
def chaos_figures(request: pytest.FixtureRequest) -> Callable[[dict[str, Any]], None]:
    def record(figures: dict[str, Any]) -> None:
        entry = {"test": request.node.name, **figures}
        line = json.dumps(entry, sort_keys=False)
        print(f"chaos figures: {line}")
        request.config.stash.setdefault(FIGURES, []).append(entry)
        path = os.environ.get("CSL_CHAOS_REPORT")
        if path:
            with open(path, "a", encoding="utf-8") as report:
                report.write(line + "\n")

    return record


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    figures = config.stash.get(FIGURES, [])
    if figures:
        terminalreporter.section("chaos figures")
        for entry in figures:
            terminalreporter.write_line(json.dumps(entry))
