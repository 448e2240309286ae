"""One lock's life, traced: the package modules and functions a call passes through.

``python -m bench lifecycle`` registers one task per shape (``skip``: the plain lock;
``queue``: ``on_duplicate="queue"``; ``limit3``: ``lock_limit=3``), warms each up with one
call, then traces a second call from the worker's side: Celery's own tracer (what a pool
runs per message: ``before_start``, the body, ``after_return``), one tick of the renewer
(the lease's renewal) and the settling of the deferred release (its reply read as an idle
worker's renewer reads it, :func:`read_release_reply`). Every
function of ``celery_singleton_lock`` entered meanwhile is counted (``sys.setprofile``), by
module.

Issue 28 asks at most 8 modules for ``skip``, 12 for ``queue`` and 10 for ``lock_limit=3``
(it counted 17, 24 and 23 before the reshaping).
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections import Counter
from types import FrameType
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from celery.app.trace import build_tracer

from celery_singleton_lock import LockedTask
from celery_singleton_lock.celery.config.lockers import locker_for

from ._common import new_prefix, redis_target
from ._tracer import request
from ._worker import make_app

PACKAGE = "celery_singleton_lock"

#: shape -> the task options of its task, and issue 28's bound on modules
SHAPES: Dict[str, Tuple[Dict[str, Any], int]] = {
    "skip": ({"on_duplicate": "skip"}, 8),
    "queue": ({"on_duplicate": "queue"}, 12),
    "limit3": ({"lock_limit": 3, "on_duplicate": "skip"}, 10),
}


def traced(call: Callable[[], Any]) -> Counter[Tuple[str, str]]:
    """(module, function) of every package function ``call`` entered, with how often."""
    seen: Counter[Tuple[str, str]] = Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            if module.startswith(PACKAGE):
                seen[(module, frame.f_code.co_name)] += 1

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen


def read_release_reply(locker: Any) -> None:
    """Read the reply of the release sent without waiting as a worker does: an idle worker's
    renewer, at its look, has the kept connections read what they owe (``settle_idle``); a
    busy worker's next acquire reads it first, on the same connection. Not
    ``locker.settle()``: a worker calls that only as it closes the locker."""
    connections = getattr(locker, "connections", None)
    if connections is None:  # no kept connections (a cluster): every release was waited
        locker.settle()
    else:
        connections.settle_idle()


def life(shape: str, url: str) -> Counter[Tuple[str, str]]:
    """The trace of one call of ``shape``'s task after a warm-up call."""
    options, _ = SHAPES[shape]
    prefix = new_prefix()
    app = make_app(prefix, "memory://", url)

    def run(self: LockedTask, key: int) -> int:
        return key

    app.task(name=f"{prefix}.{shape}", bind=True, base=LockedTask, lock_on=("key",), **options)(run)
    app.finalize()
    task = app.tasks[f"{prefix}.{shape}"]
    trace = build_tracer(task.name, task, app=app, eager=False)
    locker = locker_for(app)

    def one_call() -> None:
        task_id = str(uuid.uuid4())
        info = trace(task_id, [1], {}, request(task_id))[1]
        if info is not None and info.state != "SUCCESS":
            raise RuntimeError(f"{shape}: {info.state} {info.retval!r}")

    def call_renew_settle() -> None:
        one_call()
        locker.renewer.run_once()
        read_release_reply(locker)

    try:
        call_renew_settle()  # warm-up: connections, scripts loaded, caches filled
        return traced(call_renew_settle)
    finally:
        locker.close()


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench lifecycle", description=__doc__)
    parser.add_argument("--functions", action="store_true", help="list every function entered")
    parser.add_argument("--quick", action="store_true", help="(no effect: it is quick)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    lines: List[str] = []
    with redis_target() as target:
        for shape, (_, bound) in SHAPES.items():
            seen = life(shape, target.url)
            modules = sorted({module for module, _ in seen})
            verdict = "meets" if len(modules) <= bound else "misses"
            lines.append(
                f"{shape}: {len(modules)} modules, {len(seen)} functions "
                f"(issue 28: <= {bound} modules: {verdict})"
            )
            for module in modules:
                functions = sorted(name for mod, name in seen if mod == module)
                shown = f": {', '.join(functions)}" if args.functions else ""
                lines.append(f"   {module[len(PACKAGE) + 1 :] or PACKAGE}{shown}")
    print("one lock's life (a call through Celery's tracer, a renewal tick, the release read):")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
