"""The harness ``python -m bench instructions`` runs under callgrind: N tasks of ONE contender
through Celery's own tracer, in-process, no worker and no broker.

``python -m bench._tracer KEY KNOCKOUT TASKS URL PREFIX`` (KNOCKOUT ``-`` for none). Each task
is what a solo worker's pool calls per message: the function ``celery.app.trace.build_tracer``
builds (``before_start``, the body, ``after_return`` and Celery's bookkeeping around them),
called with a fresh task id and a request as a worker's. Everything a worker does around
it (fetch, ack, the event loop) is left out: the same for every contender, and it would only
add instructions that are not the lock's. One contender per process, so the figures of one do
not depend on the caches another warmed.

Contenders are the registry's (``plain``, ``floor``, ``locked``: ``bench/_contenders.py``),
built with redis-py's own connection class instead of the counting one the worker-level
benchmarks use (its per-request bookkeeping would be counted in every task). Knock-outs of
``locked`` (applied after the task is registered, process-wide; this process measures nothing
else):

- ``fstring``: the lock name made by ``FStringKeyer`` (an f-string of the arguments), as
  ``fastpath``'s ``fstring`` contender: the rest is what the canonical lock name costs;
- ``no-engine``: the locker's ``acquire`` (and the acquire it prepares for a task) hands back
  one lease held all along and its deferred release only reports success (the task's report
  of it still runs): no Redis traffic and no engine code per task, only the Celery layer's.

Exit status 1 (with the reason on stderr) if a task did not succeed or a lock key is left.
"""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

import redis
from celery.app.trace import build_tracer

from ._builds import FStringKeyer, WorkerSetup
from ._common import BenchError, RoundTripCounter, delete_matching
from ._contenders import REGISTRY
from ._worker import make_app

KEYS = ("plain", "floor", "locked")
KNOCKOUTS = ("fstring", "no-engine")


@dataclass
class UncountedSetup(WorkerSetup):
    """A worker-level setup whose lock clients use redis-py's own connection class."""

    @property
    def connection_class(self) -> type:
        return redis.ConnectionPool.from_url(self.url).connection_class  # type: ignore[no-any-return]


def knock_out_keyer(task: Any) -> None:
    keyer = task.lock_options.keyer
    keyer.__class__ = FStringKeyer  # as fastpath's fstring contender does
    if keyer.name((7,), {}) != f"{task.name}:(7,)":
        raise BenchError("fstring knock-out: the lock name is not the f-string's")


def knock_out_engine(task: Any) -> Callable[[], None]:
    """Replace the task's locker's per-task calls with a lease held all along; returns the
    call that releases that lease at the end."""
    locker = task.lock_locker
    real_acquire = locker.acquire
    held: List[Any] = []

    def acquire(request: Any) -> Any:
        if not held:  # the first task takes one real lease, kept but not renewed
            lease = real_acquire(request._replace(name=f"{request.name}-held"))
            locker.renewer.discard(lease)
            held.append(lease)
        lease = held[0]
        lease.released = False
        return lease

    class HeldLease:
        """The prepared acquire (a worker's mutex call) handing out the held lease."""

        def __init__(self, request: Any) -> None:
            self.request = request

        def acquire(self, name: str, owner: Any, max_lifetime: Any = None) -> Any:
            return acquire(self.request.for_call(name, owner, max_lifetime))

    def release_later(lease: Any, then: Any, *, remember_for: Optional[float] = None) -> bool:
        lease.released = True
        then(True, None)  # as the real one does once the reply is read
        return True

    locker.acquire, locker.release_later, locker.prepare = acquire, release_later, HeldLease

    def release_held() -> None:
        del locker.acquire, locker.release_later, locker.prepare
        if held:
            held[0].released = False
            locker.release(held[0])

    return release_held


def request(task_id: str) -> dict[str, Any]:
    """The request fields a worker passes to the tracer (``celery.worker.request``)."""
    return {
        "id": task_id,
        "hostname": "bench@tracer",
        "delivery_info": {"routing_key": "bench", "exchange": "", "priority": 0},
        "is_eager": False,
        "task": "bench",
    }


def run(key: str, knockout: str, tasks: int, url: str, prefix: str) -> None:
    contender = REGISTRY[key]
    if contender.worker is None or key not in KEYS:
        raise BenchError(f"no tracer contender {key!r}")
    if knockout and (key != "locked" or knockout not in KNOCKOUTS):
        raise BenchError(f"no knock-out {knockout!r} of {key!r}")
    app = make_app(prefix, "memory://", url)
    setup = UncountedSetup(app, url, prefix, RoundTripCounter())
    name = f"{prefix}.{key}"
    contender.worker(setup, name)
    app.finalize()
    # the registered task, as a worker builds its tracer with: not the proxy ``app.task``
    # returned, whose every attribute read would add ~40k instructions per task
    task = app.tasks[name]
    finish: Callable[[], None] = lambda: None  # noqa: E731
    if knockout == "fstring":
        knock_out_keyer(task)
    elif knockout == "no-engine":
        finish = knock_out_engine(task)
    trace = build_tracer(task.name, task, app=app, eager=False)
    client = redis.Redis.from_url(url)
    try:
        for i in range(tasks):
            task_id = str(uuid.uuid4())
            info = trace(task_id, [i], {}, request(task_id))[1]
            if info is not None and info.state != "SUCCESS":
                raise BenchError(f"{key} task {i}: {info.state} {info.retval!r}")
        finish()
    finally:
        for close in setup.closers:
            close()
        left = 0
        if contender.lock_keys is not None:
            pattern = contender.lock_keys(prefix, task.name)
            left = sum(1 for _ in client.scan_iter(match=pattern, count=1000))
        delete_matching(client, [f"{prefix}*"])
        client.close()
    if left:
        raise BenchError(f"{key}: {left} lock keys left after {tasks} tasks")


def main(argv: Sequence[str]) -> int:
    key, knockout, tasks, url, prefix = argv
    try:
        run(key, "" if knockout == "-" else knockout, int(tasks), url, prefix)
    except BenchError as exc:
        print(f"tracer FAILED: {exc}", file=sys.stderr)
        return 1
    print(f"tracer: {tasks} {key} tasks ({knockout}) ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
