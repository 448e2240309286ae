"""One lock scope: after a successful acquire, every path ends in one release, and the body's
outcome is never replaced by a release problem."""

from __future__ import annotations

import inspect
import logging
from typing import Any

import pytest
import redis
from celery import Celery

from celery_singleton_lock import LockConfigurationError, LockedTask
from celery_singleton_lock.celery import lock_lost
from celery_singleton_lock.engine import RedisLocker
from tests.celery.conftest import assert_released, lock_key_of
from tests.celery.tasks import core, scope


def test_a_failure_in_before_start_after_the_acquire_releases_the_lock(
    celery_app: Any, locker: RedisLocker, store: redis.Redis, unique_key: str
) -> None:
    store.set(f"setup-fails:{unique_key}", 1)
    result = scope.fails_after_its_lock.apply(args=(unique_key,))
    assert result.state == "FAILURE"
    assert not store.exists(lock_key_of(scope.fails_after_its_lock, unique_key))


def test_a_failure_in_before_start_after_the_acquire_stops_renewal(
    celery_app: Any, locker: RedisLocker, store: redis.Redis, unique_key: str
) -> None:
    store.set(f"setup-fails:{unique_key}", 1)
    scope.fails_after_its_lock.apply(args=(unique_key,))
    key = lock_key_of(scope.fails_after_its_lock, unique_key)
    assert key not in {lease.key for lease in locker.renewer.leases()}


def test_after_a_failed_before_start_the_next_run_on_that_thread_takes_a_lock_of_its_own(
    celery_app: Any, store: redis.Redis, unique_key: str
) -> None:
    store.set(f"setup-fails:{unique_key}", 1)
    scope.fails_after_its_lock.apply(args=(unique_key,))
    store.delete(f"setup-fails:{unique_key}")
    outcome = scope.fails_after_its_lock.apply(args=(unique_key,)).get()
    assert outcome == {"reentrant": False, "key_held": True}


def test_a_release_error_does_not_replace_the_outcome_of_a_body_that_returned(
    celery_app: Any, store: redis.Redis, unique_key: str
) -> None:
    result = scope.corrupts_its_lock.apply(args=(unique_key,))
    assert result.state == "SUCCESS"
    assert result.get() == "body done"


def test_a_release_error_is_logged_naming_the_task(
    celery_app: Any, store: redis.Redis, unique_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="celery_singleton_lock.release"):
        scope.corrupts_its_lock.apply(args=(unique_key,))
    messages = [r.getMessage() for r in caplog.records if r.name == "celery_singleton_lock.release"]
    assert any(scope.corrupts_its_lock.name in message for message in messages), messages


def test_a_lease_that_outlives_the_hard_time_limit_on_the_threads_pool_is_reported_lost(
    worker: Any, unique_key: str
) -> None:
    assert scope.outlives_its_time_limit.delay(unique_key).get(timeout=15) == {
        "lost": True,
        "key_exists": False,
    }


def test_a_lease_that_outlives_the_hard_time_limit_sends_lock_lost(
    worker: Any, unique_key: str
) -> None:
    seen: list[str] = []

    def receiver(task_id: str = "", **_: Any) -> None:
        seen.append(task_id)

    lock_lost.connect(receiver, weak=False)
    try:
        result = scope.outlives_its_time_limit.delay(unique_key)
        result.get(timeout=15)
    finally:
        lock_lost.disconnect(receiver)
    assert seen == [result.id]


def test_a_class_based_task_registered_without_a_name_runs_under_its_lock(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    assert core.sync_account.name == "tests.celery.tasks.core.SyncAccount"
    assert core.sync_account.delay(unique_key).get(timeout=10) == {
        "held": True,
        "key_held": True,
    }
    assert_released(store, lock_key_of(core.sync_account, unique_key))


def test_a_class_based_task_registered_without_a_name_is_validated_at_registration() -> None:
    app = Celery("scope-registration", set_as_current=False)

    class BadTtl(LockedTask):
        lock_ttl = -1

        def run(self, account: str) -> None:
            return None

    with pytest.raises(LockConfigurationError, match=r"BadTtl.*lock_ttl"):
        app.register_task(BadTtl())


def test_an_unbound_task_keeps_its_signature_and_lock_name_parameters(
    registration_app: Any,
) -> None:
    # run is wrapped to release after the body; the function's own parameters still name
    # the lock (an unbound task's run is a staticmethod: no self to skip)
    def transfer(account: str, amount: int = 1) -> int:
        return amount

    task = registration_app.task(base=LockedTask, lock_on=("account",), name="t.transfer")(transfer)
    assert inspect.signature(task.run) == inspect.signature(transfer)
    assert task.lock_options.keyer.name(("a",), {"amount": 2}) == task.lock_options.keyer.name(
        (), {"account": "a"}
    )
    assert task.run("a", amount=3) == 3


class _RunFromAMixin:
    """A ``run`` that no LockedTask subclass defines: it comes from a plain mixin."""

    def run(self, key: str) -> bool:
        lock = self.request.lock  # type: ignore[attr-defined]
        return lock is not None and lock.held


class _MixedIn(_RunFromAMixin, LockedTask):
    pass


def test_a_run_inherited_from_a_mixin_holds_the_lock_and_releases_it(
    celery_app: Any, store: redis.Redis, unique_key: str
) -> None:
    task = celery_app.register_task(_MixedIn())
    assert task.apply(args=(unique_key,)).get() is True  # held in the body
    assert not store.exists(lock_key_of(task, unique_key))


class _PatchedLater(LockedTask):
    """Its ``__call__`` is set after the class is built (as a patching library would), so no
    wrapper closes the scope when it answers without calling ``run``."""

    lock_on = ("key",)

    def run(self, key: str, early: bool = False) -> dict[str, Any]:
        lock = self.request.lock
        return {"reentrant": lock.reentrant, "key_held": bool(lock.held)}


def _answers_early(self: Any, *args: Any, **kwargs: Any) -> Any:
    return "early" if kwargs.get("early") else self.run(*args, **kwargs)


def test_a_scope_left_open_by_an_ended_run_is_not_taken_for_an_outer_one(
    celery_app: Any, store: redis.Redis, unique_key: str
) -> None:
    _PatchedLater.__call__ = _answers_early  # type: ignore[assignment]
    task = celery_app.register_task(_PatchedLater())
    assert task.apply(args=(unique_key,), kwargs={"early": True}).get() == "early"
    # the next run in this thread takes the lock itself (the leftover is closed first)
    assert task.apply(args=(unique_key,)).get() == {"reentrant": False, "key_held": True}
    assert not store.exists(lock_key_of(task, unique_key))
