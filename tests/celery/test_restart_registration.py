"""Policy ``restart`` and ``lock_cancel_grace``: what registration accepts and refuses (or the
backend's capabilities refuse), naming the task and the option."""

from __future__ import annotations

import logging

import pytest
from celery import Celery

from celery_singleton_lock import LockConfigurationError
from celery_singleton_lock.celery.duplicates.policies import Restart
from tests.celery.registration import app_with, register


def test_restart_registers_with_its_policy_object_and_the_default_grace(
    registration_app: Celery,
) -> None:
    options = register(registration_app, on_duplicate="restart").lock_options
    assert isinstance(options.policy, Restart)
    assert (options.on_duplicate, options.cancel_grace) == ("restart", 5.0)


def test_a_cancel_grace_of_a_restart_task_is_kept(registration_app: Celery) -> None:
    task = register(registration_app, on_duplicate="restart", lock_cancel_grace=1)
    assert task.lock_options.cancel_grace == 1.0


def test_a_cancel_grace_with_another_policy_is_refused(registration_app: Celery) -> None:
    with pytest.raises(
        LockConfigurationError, match=r"billing\.job: lock_cancel_grace=1 .*on_duplicate='skip'"
    ):
        register(registration_app, lock_cancel_grace=1)


@pytest.mark.parametrize("grace", [-1, "5", True, 10**9])
def test_a_cancel_grace_that_is_not_seconds_is_refused(
    registration_app: Celery, grace: object
) -> None:
    with pytest.raises(
        LockConfigurationError,
        match=r"billing\.job: lock_cancel_grace( must be a number|=.* is out of range)",
    ):
        register(registration_app, on_duplicate="restart", lock_cancel_grace=grace)


@pytest.mark.parametrize(
    ("option", "value"),
    [("lock_limit", 2), ("lock_rate", "1/s"), ("lock_cooldown", 1), ("lock_debounce", 1)],
)
def test_restart_with_an_option_of_several_holders_or_a_delay_is_refused(
    registration_app: Celery, option: str, value: object
) -> None:
    with pytest.raises(
        LockConfigurationError, match=rf"billing\.job: .*{option}.*restart|restart.*{option}"
    ):
        register(registration_app, on_duplicate="restart", **{option: value})


def test_restart_with_dedupe_on_enqueue_is_refused(registration_app: Celery) -> None:
    with pytest.raises(LockConfigurationError, match=r"billing\.job.*restart.*dedupe_on_enqueue"):
        register(registration_app, on_duplicate="restart", dedupe_on_enqueue=True)


def test_a_cancel_grace_on_a_threads_pool_warns_that_restart_is_cooperative_there(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = app_with(worker_pool="threads")
    try:
        with caplog.at_level(logging.WARNING, logger="celery_singleton_lock.config"):
            register(app, on_duplicate="restart", lock_cancel_grace=2)
    finally:
        app.close()
    assert "lock_cancel_grace=2 has no effect on the threads pool" in caplog.text
