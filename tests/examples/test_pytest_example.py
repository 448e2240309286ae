"""examples/test_with_pytest.py, the file the docs' "Test your tasks" shows, run as a user runs it.

``python -m pytest examples/test_with_pytest.py`` in a subprocess, from the repository root:
the fixture ``singleton_lock_url`` comes from the installed package's ``pytest11`` entry point
(no conftest of this suite applies there), Celery's fixtures from pytest-celery's plugin.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "examples/test_with_pytest.py"


def test_the_plugin_is_installed_as_a_pytest11_entry_point() -> None:
    # the distribution's own entry points: entry_points(group=...) is Python 3.10's
    installed = metadata.distribution("celery-singleton-lock").entry_points
    plugins = {ep.name: ep.value for ep in installed if ep.group == "pytest11"}
    assert plugins.get("singleton_lock") == "celery_singleton_lock.pytest_plugin", (
        "no pytest11 entry point 'singleton_lock': the installed package predates it; "
        "reinstall it (pip install -e '.[test]')"
    )


@pytest.mark.timeout(180)
def test_the_pytest_example_passes_as_it_stands() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", EXAMPLE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    output = f"--- stdout ---\n{done.stdout}\n--- stderr ---\n{done.stderr}"
    assert done.returncode == 0, output
    # every test of the file passed: none skipped, none deselected, none errored
    assert re.search(r"^[1-9]\d* passed(, \d+ warnings?)? in ", done.stdout, re.M), output


def test_the_docs_include_the_example_file_whole() -> None:
    page = (ROOT / "docs" / "how-to" / "test-your-tasks.md").read_text()
    assert f'```python\n--8<-- "{EXAMPLE}"\n```' in page
