"""Run the benchmarks: ``python -m bench [NAME] [OPTIONS]``.

Every public module of this package (``bench/engine.py``, ``bench/celery.py``, ...) is one
benchmark with a ``main(argv) -> int``; modules starting with ``_`` are helpers. With no NAME,
every benchmark runs in turn with the same OPTIONS (e.g. ``python -m bench --quick``), except
those in ``ON_REQUEST``, which run only by name.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path
from typing import Callable, List, Optional

HERE = Path(__file__).resolve().parent

#: Run only when named: the kill soak is a reliability run of about 11 minutes (1,000 child
#: kills), not a speed comparison, and would triple the time of a plain ``python -m bench``.
ON_REQUEST = frozenset({"soak"})


def benchmarks() -> List[str]:
    """Names of the benchmark modules, in alphabetical order."""
    return sorted(
        info.name
        for info in pkgutil.iter_modules([str(HERE)])
        if not info.name.startswith("_") and not info.ispkg
    )


def load(name: str) -> Callable[[List[str]], int]:
    module = importlib.import_module(f"{__package__ or 'bench'}.{name}")
    return module.main  # type: ignore[no-any-return]


def usage(names: List[str]) -> str:
    return (
        "usage: python -m bench [NAME] [OPTIONS]\n"
        f"benchmarks: {', '.join(names)} (all but {', '.join(sorted(ON_REQUEST))} when NAME is"
        " left out)\n"
        "options of one benchmark: python -m bench NAME --help"
    )


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = benchmarks()
    if argv and argv[0] in ("-h", "--help", "help"):
        print(usage(names))
        return 0
    if argv and not argv[0].startswith("-"):
        if argv[0] not in names:
            print(f"unknown benchmark {argv[0]!r}\n{usage(names)}", file=sys.stderr)
            return 2
        selected, rest = [argv[0]], argv[1:]
    else:
        selected, rest = [name for name in names if name not in ON_REQUEST], argv
    status = 0
    for index, name in enumerate(selected):
        if len(selected) > 1:
            print(("\n" if index else "") + f"=== bench {name} ===", flush=True)
        status = max(status, load(name)(list(rest)))
    return status


if __name__ == "__main__":
    sys.exit(main())
