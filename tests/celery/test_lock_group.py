"""``lock_group`` on real ``celery worker`` processes and real Redis: the calls of every task of
a group with equal ``lock_on`` arguments share one lock and its limit (issue 31, "Shared").

``charge(tenant, amount)`` and ``refund(tenant, order)`` are in group ``api`` with
``lock_on=("tenant",)``, ``lock_limit=2`` and ``on_duplicate="queue"`` (tests/celery/tasks/
groups.py). The scenario runs once, on one prefork worker of 8 processes: 6 + 6 calls of
tenant t1 and 2 + 2 of tenant t2, 1 s bodies; each test asserts one fact of its outcome.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Any, Iterator

import pytest
import redis
from celery.exceptions import WorkerLostError
from celery.result import AsyncResult
from celery.signals import before_task_publish

from celery_singleton_lock.engine import LockHolder, RedisLocker
from celery_singleton_lock.testing import RedisServer
from tests.celery.tasks import groups
from tests.celery.tasks.core import open_gate
from tests.celery.workers import CeleryWorkerProcess, Servers, lock_key, unique, worker_group
from tests.support import wait_until


@dataclass
class Shared:
    """The outcome of the scenario: each tenant's calls, and what the bodies recorded."""

    tenants: dict[str, list[AsyncResult]]
    run: str
    store: redis.Redis

    def ran(self, tenant: str) -> list[str]:
        """Task ids of the bodies of ``tenant`` that ran, in start order."""
        return [run.split(b"|")[0].decode() for run in self.store.lrange(f"runs:{tenant}", 0, -1)]

    def most(self, key: str) -> int:
        return int(self.store.get(f"most:{key}") or 0)


@pytest.fixture(scope="module")
def prefork(servers: Servers, celery_app: Any) -> Iterator[CeleryWorkerProcess]:
    """The module's worker: prefork, 8 processes (a pool child may be killed: it lives on)."""
    with worker_group(servers) as group:
        yield group.start(1, pool="prefork", concurrency=8)[0]


@pytest.fixture(scope="module")
def shared(prefork: CeleryWorkerProcess, lock_server: RedisServer) -> Iterator[Shared]:
    store = lock_server.client()  # where the bodies record (tests/celery/tasks/core.py)
    worker = prefork
    t1, t2, run = unique("t1"), unique("t2"), unique("run")
    tenants: dict[str, list[AsyncResult]] = {t1: [], t2: []}
    for index in range(6):  # interleaved: the two tasks compete for t1's two slots
        tenants[t1].append(groups.charge.apply_async((t1, index, run), queue=worker.queue))
        tenants[t1].append(groups.refund.apply_async((t1, f"o{index}", run), queue=worker.queue))
    for index in range(2):
        tenants[t2].append(groups.charge.apply_async((t2, index, run), queue=worker.queue))
        tenants[t2].append(groups.refund.apply_async((t2, f"o{index}", run), queue=worker.queue))
    for results in tenants.values():
        for result in results:
            result.get(timeout=120)
    yield Shared(tenants, run, store)
    store.close()


def test_calls_of_both_tasks_of_a_tenant_never_exceed_the_groups_limit(shared: Shared) -> None:
    t1 = next(iter(shared.tenants))
    assert shared.most(t1) <= 2


def test_calls_of_both_tasks_of_a_tenant_reach_the_groups_limit(shared: Shared) -> None:
    t1 = next(iter(shared.tenants))
    assert shared.most(t1) == 2


def test_every_call_of_the_group_runs_exactly_once(shared: Shared) -> None:
    for tenant, results in shared.tenants.items():
        assert sorted(shared.ran(tenant)) == sorted(result.id for result in results)


def test_another_tenants_calls_run_alongside_a_tenant_at_its_limit(shared: Shared) -> None:
    # a tenant never has more than 2 bodies inside: 3 at once means t2 ran beside t1
    assert shared.most(shared.run) >= 3


def test_nothing_is_left_parked_behind_a_group_lock(shared: Shared) -> None:
    for tenant in shared.tenants:
        assert shared.store.exists(lock_key(groups.charge, tenant, 0, shared.run) + ":parked") == 0


def test_the_group_lock_is_named_after_the_group(shared: Shared) -> None:
    t1 = next(iter(shared.tenants))
    key = lock_key(groups.refund, t1, "o0", shared.run)
    assert key == lock_key(groups.charge, t1, 0, shared.run)
    assert key.startswith("singleton-lock:{api:")


# -- kill -9 of a pool child holding a slot of the group's lock ------------------------------


def holders(store: redis.Redis, name: str) -> list[LockHolder]:
    """The holders of the 2 slots of the group lock ``name``, slot order."""
    return RedisLocker(store, prefix=groups.charge.lock_options.prefix).inspect.holders(name, 2)


def test_a_killed_pool_childs_slot_goes_to_a_parked_call_of_the_other_task_of_the_group(
    prefork: CeleryWorkerProcess, store: redis.Redis
) -> None:
    tenant, run = unique("t"), unique("run")
    name = groups.charge.lock_options.keyer.name((tenant, 0, run), {})
    charges = [
        groups.charge.apply_async((tenant, index, run, 10), queue=prefork.queue)
        for index in range(2)
    ]
    wait_until(lambda: len(holders(store, name)) == 2, timeout=30)
    parked = groups.refund.apply_async((tenant, "o", run, 0), queue=prefork.queue)
    key = lock_key(groups.charge, tenant, 0, run)
    wait_until(lambda: store.zcard(f"{key}:parked") == 1, timeout=30)
    # slot 2: not the lock key itself, which the mutex's hand-off would also find free
    victim = next(held for held in holders(store, name) if held.key.endswith(":slot:2"))
    (killed,) = (result for result in charges if result.id == victim.task_id)
    assert victim.pid is not None
    os.kill(victim.pid, signal.SIGKILL)
    with pytest.raises(WorkerLostError):
        killed.get(timeout=30)
    parked.get(timeout=60)
    ran = [entry.split(b"|")[0].decode() for entry in store.lrange(f"runs:{tenant}", 0, -1)]
    assert ran.count(parked.id) == 1  # the refund ran once, in the charge's freed slot
    (kept,) = (result for result in charges if result is not killed)
    # (no gauge here: the killed body entered it and never left)
    assert kept.get(timeout=60)["lost"] is False  # the other charge kept its slot


# -- dedupe_on_enqueue follows the group's name ---------------------------------------------


def test_a_call_of_one_task_is_not_published_while_another_tasks_call_of_its_group_runs(
    worker: Any, store: redis.Redis
) -> None:
    tenant = unique("tenant")
    first = groups.notify_by_mail.delay(tenant, "a@example.org")
    wait_until(lambda: store.llen(f"runs:{tenant}") == 1, timeout=30)  # running
    published: list[str] = []

    def record(sender: Any = None, headers: Any = None, **_: Any) -> None:
        if sender == groups.notify_by_sms.name and headers:
            published.append(headers["id"])

    before_task_publish.connect(record, weak=False)
    try:
        second = groups.notify_by_sms.delay(tenant, "555-0100")
    finally:
        before_task_publish.disconnect(record)
        open_gate(tenant)
    assert (published, second.id) == ([], first.id)
    assert first.get(timeout=30) == first.id
