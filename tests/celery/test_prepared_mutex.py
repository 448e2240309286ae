"""What a worker's calls of a task go through: the acquire of a mutex call prepared once per
task, resolved options and locker, never one of a locker the app has dropped; the request
every call starts from, with what is the same for every call."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest
from celery import Celery

from celery_singleton_lock import LockedTask
from celery_singleton_lock.celery.config.lockers import forget_locker, locker_for
from celery_singleton_lock.celery.task import execution
from celery_singleton_lock.engine import Lease, LockHolder, Owner, RedisLocker
from celery_singleton_lock.testing import RedisServer


@pytest.fixture
def task(own_app: Celery) -> Iterator[Any]:
    @own_app.task(base=LockedTask, shared=False)
    def planned(x: int) -> int:
        return x

    yield own_app.tasks[planned.name]
    forget_locker(own_app)


def test_a_tasks_prepared_acquire_is_made_once(task: Any) -> None:
    first = execution.prepared(task, task.lock_options)
    assert execution.prepared(task, task.lock_options) is first


def test_it_goes_through_the_apps_locker(task: Any) -> None:
    assert execution.prepared(task, task.lock_options).locker is locker_for(task.app)


def test_a_dropped_locker_is_never_used_again(task: Any) -> None:
    dropped = execution.prepared(task, task.lock_options).locker
    forget_locker(task.app)
    plan = execution.prepared(task, task.lock_options)
    assert plan.locker is not dropped
    assert plan.locker is locker_for(task.app)


def test_options_resolved_again_prepare_it_again(task: Any) -> None:
    first = execution.prepared(task, task.lock_options)
    assert execution.prepared(task, task.resolve_lock_options()) is not first


def test_it_takes_the_lock_the_call_names(task: Any) -> None:
    plan = execution.prepared(task, task.lock_options)
    name = task.lock_options.keyer.name((7,), {})
    lease = plan.acquire.acquire(name, Owner(task_id="t-1"))
    assert isinstance(lease, Lease)
    assert lease.key == locker_for(task.app).keys(name).lock
    assert lease.release()


def test_a_subclass_with_a_locker_of_its_own_goes_through_it(
    own_app: Celery, redis_server: RedisServer
) -> None:
    own = RedisLocker(redis_server.client(), prefix="own")

    class OwnLocker(LockedTask):  # type: ignore[misc]
        lock_locker = own

    @own_app.task(base=OwnLocker, shared=False)
    def planned_own(x: int) -> int:
        return x

    task = own_app.tasks[planned_own.name]
    try:
        assert execution.prepared(task, task.lock_options).locker is own
    finally:
        own.close()


@pytest.fixture
def limited(own_app: Celery) -> Iterator[Callable[[Any], Any]]:
    """Registers a task of the ``lock_limit`` given (once per test)."""

    def register(limit: Any) -> Any:
        @own_app.task(base=LockedTask, shared=False, lock_limit=limit)
        def limited_calls(x: int) -> int:
            return x

        return own_app.tasks[limited_calls.name]

    yield register
    forget_locker(own_app)


def test_a_static_lock_limit_is_in_the_request_every_call_starts_from(limited: Any) -> None:
    task = limited(3)
    assert execution.request_base(task, task.lock_options, True, False).limit == 3


def test_a_callable_lock_limit_is_left_to_each_call(limited: Any) -> None:
    task = limited(lambda x: x)
    assert execution.request_base(task, task.lock_options, True, False).limit == 1


def test_a_static_lock_limits_prepared_acquire_takes_that_many_holders(limited: Any) -> None:
    task = limited(3)
    assert task.lock_options.prepared  # a worker's call goes through it
    plan = execution.prepared(task, task.lock_options)
    name = task.lock_options.keyer.name((7,), {})
    outcomes = [plan.acquire.acquire(name, Owner(task_id=f"t-{n}")) for n in range(4)]
    assert [type(outcome) for outcome in outcomes] == [Lease, Lease, Lease, LockHolder]
    for outcome in outcomes[:3]:
        assert outcome.release()
