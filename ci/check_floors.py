"""Keep the declared floors, the oldest pins and the oldest venv in step.

``python ci/check_floors.py``: fail unless every ``name>=X`` floor in pyproject.toml
(``[project].dependencies`` and the ``embedded`` and ``test`` extras) is pinned as ``name==X``
in ci/constraints-oldest.txt. Pins of names pyproject.toml does not mention are other
packages' floors (e.g. Celery's billiard), allowed.

``python ci/check_floors.py --installed``: fail unless the running interpreter has exactly the
pinned versions installed and is itself the oldest Python ``requires-python`` accepts (the
oldest corner really is the oldest), unless ``OLDEST_PYTHON`` in the environment chose another.
"""

from __future__ import annotations

import os
import re
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = ("embedded", "test")
FLOOR = re.compile(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?\s*>=\s*([^,;\s]+)\s*$")
PYTHON_FLOOR = re.compile(r"^>=\s*(\d+\.\d+)\s*$")
PIN = re.compile(r"^([A-Za-z0-9_.-]+)\s*==\s*(\S+)\s*$")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project() -> dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # Python < 3.11: the oldest corner's pytest brings tomli
        import tomli as tomllib  # type: ignore[no-redef]

    table: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return table


def python_floor() -> str:
    """The X.Y of ``requires-python = ">=X.Y"``."""
    match = PYTHON_FLOOR.match(project()["requires-python"])
    if match is None:
        sys.exit(f"pyproject.toml: requires-python is not '>=X.Y': {project()['requires-python']}")
    return match[1]


def floors() -> dict[str, str]:
    project_table = project()
    requirements = list(project_table["dependencies"])
    for extra in EXTRAS:
        requirements += project_table["optional-dependencies"][extra]
    found: dict[str, str] = {}
    for requirement in requirements:
        match = FLOOR.match(requirement)
        if match:
            found[normalize(match[1])] = match[2]
    return found


def pins() -> dict[str, str]:
    found: dict[str, str] = {}
    for line in (ROOT / "ci" / "constraints-oldest.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        match = PIN.match(line)
        if match:
            found[normalize(match[1])] = match[2]
        elif line:
            sys.exit(f"ci/constraints-oldest.txt: not an exact pin: {line!r}")
    return found


def check_installed() -> int:
    pinned = pins()
    problems = []
    for name, version in sorted(pinned.items()):
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = "not installed"
        if installed != version:
            problems.append(f"{name}: pinned {version}, installed {installed}")
    running = "{}.{}".format(*sys.version_info[:2])
    if running != python_floor():
        # OLDEST_PYTHON in the environment: another interpreter chosen on purpose (ci/python.sh)
        off_floor = f"python: requires-python floor {python_floor()}, running {running}"
        if os.environ.get("OLDEST_PYTHON"):
            print(f"{off_floor} (OLDEST_PYTHON={os.environ['OLDEST_PYTHON']})", file=sys.stderr)
        else:
            problems.append(off_floor)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    print(f"installed versions match the oldest pins: {len(pinned)} packages, on Python {running}")
    return 0


def main() -> int:
    if sys.argv[1:] == ["--installed"]:
        return check_installed()
    declared, pinned = floors(), pins()
    problems = [
        f"pyproject.toml says {name}>={floor} but ci/constraints-oldest.txt pins "
        + (f"{name}=={pinned[name]}" if name in pinned else f"no {name}")
        for name, floor in sorted(declared.items())
        if pinned.get(name) != floor
    ]
    if problems:
        print("\n".join(problems), file=sys.stderr)
        print("floors and oldest pins must be equal: change both together", file=sys.stderr)
        return 1
    print(f"floors match the oldest pins: {len(declared)} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
