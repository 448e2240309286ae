"""What importing each part of the package loads: the runtime loads no test tools, and the
pytest plugin loads neither Celery nor pytest-celery (whose Docker half needs a Docker engine).

Each import runs in a fresh interpreter, from the repository root, so nothing this test
session already imported counts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def modules_loaded_by(statement: str) -> set[str]:
    script = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


def top_level(modules: set[str]) -> set[str]:
    return {name.partition(".")[0] for name in modules}


def test_the_runtime_package_loads_no_test_tools() -> None:
    loaded = modules_loaded_by(
        "import celery_singleton_lock, celery_singleton_lock.celery\n"
        "from celery_singleton_lock import LockedTask"
    )
    assert "celery_singleton_lock.testing" not in loaded
    assert "celery_singleton_lock.pytest_plugin" not in loaded
    assert not top_level(loaded) & {"pytest", "_pytest", "pytest_celery"}


def test_the_pytest_plugin_loads_neither_celery_nor_pytest_celery() -> None:
    loaded = modules_loaded_by("import celery_singleton_lock.pytest_plugin")
    assert not top_level(loaded) & {"celery", "pytest_celery", "docker"}


def test_the_testing_helpers_load_no_pytest() -> None:
    loaded = modules_loaded_by("import celery_singleton_lock.testing")
    assert not top_level(loaded) & {"pytest", "_pytest"}


def test_the_celery_command_entry_point_loads_no_celery_layer() -> None:
    # every `celery` process (a plain app's worker too) loads it: it must connect nothing
    loaded = modules_loaded_by("import celery_singleton_lock.command_line")
    assert not {name for name in loaded if name.startswith("celery_singleton_lock.celery")}
