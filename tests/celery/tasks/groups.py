"""Tasks sharing their locks through ``lock_group`` (tests/celery/test_lock_group.py, and
the group lock of test_celery_locks.py).

``charge`` and ``refund`` take different arguments but name the lock by ``tenant`` in the group
``api``, so their calls of one tenant share one lock and its two slots. Their body records, as
:func:`~tests.celery.tasks.limits.limited_body` does, the most bodies of one tenant ever inside
at once (``most:<tenant>``, across both tasks) and, under ``most:<run>``, the most bodies of
the test's run inside at once (every tenant): above a tenant's limit, other tenants ran too.
"""

from __future__ import annotations

from typing import Any

from celery_singleton_lock import LockedTask
from tests.celery.tasks.core import app, gated_body, store
from tests.celery.tasks.limits import ENTER, limited_body
from tests.celery.tasks.queueing import QUEUE

GROUP = {"lock_group": "api", "lock_on": ("tenant",), "lock_limit": 2, "on_duplicate": QUEUE}


def _counted(task: LockedTask, tenant: str, run: str, seconds: float) -> dict[str, Any]:
    r = store()
    r.eval(ENTER, 2, f"gauge:{run}", f"most:{run}")
    try:
        return limited_body(task, tenant, seconds)
    finally:
        r.decr(f"gauge:{run}")


@app.task(bind=True, base=LockedTask, lock_ttl=5, **GROUP)
def charge(self: LockedTask, tenant: str, amount: int, run: str, seconds: float = 1.0) -> Any:
    return _counted(self, tenant, run, seconds)


@app.task(bind=True, base=LockedTask, lock_ttl=5, **GROUP)
def refund(self: LockedTask, tenant: str, order: str, run: str, seconds: float = 1.0) -> Any:
    return _counted(self, tenant, run, seconds)


#: dedupe_on_enqueue in a group: a queued or running call of one task drops the other's
NOTIFY = {"lock_group": "notify", "lock_on": ("tenant",), "dedupe_on_enqueue": True}


@app.task(bind=True, base=LockedTask, lock_ttl=5, **NOTIFY)
def notify_by_mail(self: LockedTask, tenant: str, address: str) -> str:
    return gated_body(tenant, self.request.id)


@app.task(bind=True, base=LockedTask, lock_ttl=5, **NOTIFY)
def notify_by_sms(self: LockedTask, tenant: str, number: str) -> str:
    return gated_body(tenant, self.request.id)


#: one lock for the whole group (lock_on=()), two slots, parked calls served round robin by
#: tenant; acks_late, so that a killed worker's running call is delivered again (the chaos
#: test tests/chaos/test_group_fair_kills.py)
FAIR = {
    "lock_group": "fair-api",
    "lock_on": (),
    "lock_limit": 2,
    "on_duplicate": QUEUE,
    "lock_fair_by": ("tenant",) if QUEUE == "queue" else None,
    "acks_late": True,
    "lock_ttl": 3,
}


def _recorded(task: LockedTask, tenant: str, run: str, seconds: float) -> str:
    """Record the body's start (``starts:<run>``: task id|tenant|pid|time) and, if it ends,
    its end (``ends:<run>``: task id|time)."""
    import os
    import time

    r = store()
    r.rpush(f"starts:{run}", f"{task.request.id}|{tenant}|{os.getpid()}|{time.time()}")
    time.sleep(seconds)
    r.rpush(f"ends:{run}", f"{task.request.id}|{time.time()}")
    return tenant


@app.task(bind=True, base=LockedTask, **FAIR)
def fair_charge(self: LockedTask, tenant: str, run: str, seconds: float = 1.0) -> str:
    return _recorded(self, tenant, run, seconds)


@app.task(bind=True, base=LockedTask, **FAIR)
def fair_refund(self: LockedTask, tenant: str, run: str, seconds: float = 1.0) -> str:
    return _recorded(self, tenant, run, seconds)
