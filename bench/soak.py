"""Soak: ``kill -9`` of prefork pool children running a body (issue 19, part 1).

``python -m bench soak [--quick] [--kills N] [--seed S]``. Throwaway loopback servers (a broker
with results in its db 1, and a lock server that also holds the bodies' records); two real
``celery worker`` processes (prefork ``-c 2``, prefetch 1) run ``tests/chaos/soakapp.py``'s
``queue``, ``retry`` and ``skip`` tasks; a call is sent every 0.15 s (round robin over the
policies, 2 keys each, bodies of 0.5 s) and every 0.6 s a pool child running a body is
SIGKILLed, until N kills (1,000; ``--quick``: 100). The soak itself is
``tests/chaos/kill_soak.py``, which the test suite runs too (``tests/chaos/test_child_kills.py``).

Figures: kills, calls, bodies ended and killed, parked calls, lock retries, skips, locks
reclaimed by the main process, outcomes by policy; and the checks: calls whose body ended but
whose outcome came more than 5 s later or never (hung), calls with no outcome (lost), calls
whose body ran twice (doubled), bodies of one key running at once (overlaps). Exit status 1 if
a check failed. About 11 minutes at 1,000 kills, 75 s with ``--quick``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import replace
from typing import Optional, Sequence

from ._common import fill_defaults
from .celery import _pkg_version


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench soak", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="100 kills (default 1,000)")
    parser.add_argument("--kills", type=int, help="pool children to kill")
    parser.add_argument("--seed", type=int, help="random seed (default: from the clock)")
    args = parser.parse_args(list(argv))
    fill_defaults(parser, args, {"kills": (100, 1000)}, positive=("kills",))
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    from tests.chaos import kill_soak

    seed = args.seed if args.seed is not None else time.time_ns() % 2**32
    size = replace(kill_soak.FULL, kills=args.kills)
    print(
        f"soak: {size.kills} kills; python {platform.python_version()}, celery "
        f"{_pkg_version('celery')}, kombu {_pkg_version('kombu')}, redis-py "
        f"{_pkg_version('redis')}; seed {seed}",
        flush=True,
    )
    with kill_soak.soak_servers() as servers:
        figures = kill_soak.run(servers, size, seed, say=lambda line: print(line, flush=True))
    print(json.dumps(figures.as_dict(), indent=1))
    failed = figures.failed
    if figures.kills < size.kills:
        failed.append(f"only {figures.kills} kills")
    print("FAILED: " + ", ".join(failed) if failed else "OK: 0 hung, 0 lost, 0 doubled, 0 overlaps")
    return 1 if failed else 0
