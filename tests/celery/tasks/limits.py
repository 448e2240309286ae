"""Tasks with ``lock_limit``, ``lock_cooldown`` and ``lock_rate`` (tests/celery/test_lock_limit.py,
test_lock_limit_processes.py, test_lock_cooldown.py, test_lock_rate.py).

Their body records, in the records Redis, the most bodies of one key ever inside at once
(``most:<key>``) besides what :func:`~tests.celery.tasks.core.body` records (``runs:<key>``,
``gauge:<key>``).
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery_singleton_lock import LockedTask
from tests.celery.tasks.core import app, store
from tests.celery.tasks.queueing import QUEUE

#: KEYS[1] gauge, KEYS[2] most: one more body inside; keep the most ever seen
ENTER = """
local inside = redis.call('INCR', KEYS[1])
if inside > tonumber(redis.call('GET', KEYS[2]) or '0') then
  redis.call('SET', KEYS[2], inside)
end
return inside
"""


def limited_body(task: LockedTask, key: str, seconds: float) -> dict[str, Any]:
    r = store()
    r.eval(ENTER, 2, f"gauge:{key}", f"most:{key}")
    r.rpush(f"runs:{key}", f"{task.request.id}|{os.getpid()}|{time.time()}")
    try:
        time.sleep(seconds)
    finally:
        r.decr(f"gauge:{key}")
    handle = task.request.lock
    return {"slot": handle.slot, "key": handle.key, "fence": handle.fence, "lost": handle.lost}


def limited_task(name: str, **options: Any) -> Any:
    def run(self: LockedTask, key: str, seconds: float = 0.0) -> dict[str, Any]:
        return limited_body(self, key, seconds)

    run.__name__ = run.__qualname__ = name
    return app.task(
        bind=True, base=LockedTask, name=f"{__name__}.{name}", lock_on=("key",), **options
    )(run)


limit3_skip = limited_task("limit3_skip", lock_limit=3, on_duplicate="skip", lock_ttl=5)
limit3_retry = limited_task(
    "limit3_retry",
    lock_limit=3,
    on_duplicate="retry",
    lock_ttl=5,
    lock_retry_backoff=0.2,
    lock_retry_backoff_max=1.0,
    lock_fencing=True,
)
#: kill -9 of a whole worker: its slot must expire by itself, within this TTL
limit3_short_ttl = limited_task("limit3_short_ttl", lock_limit=3, on_duplicate="skip", lock_ttl=2)
#: kill -9 of a pool child: only the main process frees its slot this long before the TTL
limit3_long_ttl = limited_task("limit3_long_ttl", lock_limit=3, on_duplicate="skip", lock_ttl=30)
limit2_wait = limited_task("limit2_wait", lock_limit=2, on_duplicate="wait", lock_wait_timeout=20)


def _tenant_limit(key: str, seconds: float) -> int:
    """Per-tenant caps: keys starting 'big' get 2, 'zero' a bad 0, the others 1."""
    return 2 if key.startswith("big") else (0 if key.startswith("zero") else 1)


limit_per_tenant = limited_task("limit_per_tenant", lock_limit=_tenant_limit, on_duplicate="skip")


# -- lock_cooldown ----------------------------------------------------------------------------

cooldown3_skip = limited_task("cooldown3_skip", lock_cooldown=3, on_duplicate="skip")
cooldown2_retry = limited_task(
    "cooldown2_retry", lock_cooldown=2, on_duplicate="retry", lock_retry_backoff=0.05
)
#: the default lock_ttl (15 s): a waiter woken only at the holder's TTL starts ~14 s late
cooldown2_wait = limited_task(
    "cooldown2_wait", lock_cooldown=2, on_duplicate="wait", lock_wait_timeout=30
)


def _failing(name: str, after: str) -> Any:
    def run(self: LockedTask, key: str) -> None:
        store().rpush(f"runs:{key}", f"{self.request.id}|{os.getpid()}|{time.time()}")
        raise ValueError("the body fails")

    run.__name__ = run.__qualname__ = name
    return app.task(
        bind=True,
        base=LockedTask,
        name=f"{__name__}.{name}",
        lock_on=("key",),
        lock_cooldown=3,
        lock_cooldown_after=after,
        on_duplicate="skip",
    )(run)


cooldown_fails_after_success = _failing("cooldown_fails_after_success", "success")
cooldown_fails_after_always = _failing("cooldown_fails_after_always", "always")


# -- lock_rate --------------------------------------------------------------------------------

rate3_retry = limited_task(
    "rate3_retry", lock_rate="3/3s", on_duplicate="retry", lock_retry_backoff=0.05
)
rate2_skip = limited_task("rate2_skip", lock_rate="2/m", on_duplicate="skip")


# -- on_duplicate="queue" with them -----------------------------------------------------------

# QUEUE: "retry" in the Redis Cluster streams (tests/celery/test_cluster.py's ClusterServers)
limit3_queue = limited_task("limit3_queue", lock_limit=3, on_duplicate=QUEUE, lock_ttl=5)


def _live_cap(key: str, seconds: float) -> int:
    """A tenant's cap as it is now (``cap:<key>`` in the records Redis; 3 when unset)."""
    return int(store().get(f"cap:{key}") or 3)


@app.task(
    bind=True,
    base=LockedTask,
    name=f"{__name__}.fair_limit2_queue",
    lock_on=("key",),
    lock_limit=2,
    on_duplicate=QUEUE,
    # a Redis Cluster's workers serve "retry" here (QUEUE), where nothing is parked to be fair
    lock_fair_by=("tenant",) if QUEUE == "queue" else None,
)
def fair_limit2_queue(self: LockedTask, key: str, tenant: str, seconds: float) -> dict[str, Any]:
    """Two at once per key; parked calls served round robin across tenants (issue 31)."""
    return limited_body(self, key, seconds)


#: a live cap set while it runs (issue 31's "live" acceptance; its own task: the cap is per task)
live3_queue = limited_task("live3_queue", lock_limit=3, on_duplicate=QUEUE, lock_ttl=10)


#: a cap changed while calls are parked (issue 28's bug 2)
live_cap_queue = limited_task("live_cap_queue", lock_limit=_live_cap, on_duplicate=QUEUE)
rate3_queue = limited_task("rate3_queue", lock_rate="3/3s", on_duplicate=QUEUE)
cooldown1_queue = limited_task("cooldown1_queue", lock_cooldown=1, on_duplicate=QUEUE)
#: issue 30's acceptance size: 9 calls at 3 per 10 s
rate3_per_10s_retry = limited_task(
    "rate3_per_10s_retry", lock_rate="3/10s", on_duplicate="retry", lock_retry_backoff=0.05
)
#: on Sentinel and on a Cluster (tests/celery/test_sentinel.py, test_cluster.py)
limit2_skip = limited_task("limit2_skip", lock_limit=2, on_duplicate="skip", lock_ttl=5)
