"""How ``compat.Singleton`` reads celery-singleton's settings, without a server: the lock
names it computes and its checks, on an app of its own."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_singleton_lock.celery.config.resolution import unknown_settings
from celery_singleton_lock.compat import Singleton
from celery_singleton_lock.errors import LockConfigurationError


def _task_of(**settings: Any) -> Any:
    app = Celery("settings", set_as_current=False)
    app.conf.update(settings)

    @app.task(base=Singleton, name="tasks.refresh", shared=False, unique_on="key")
    def refresh(key: str) -> str:
        return key

    return app.tasks["tasks.refresh"]


def test_singleton_key_prefix_starts_every_lock_name() -> None:
    task = _task_of(singleton_key_prefix="staging_")
    assert task.lock_options.keyer.name(("a",), {}).startswith("staging_tasks.refresh:")


def test_without_singleton_key_prefix_lock_names_start_with_the_task_name() -> None:
    assert _task_of().lock_options.keyer.name(("a",), {}).startswith("tasks.refresh:")


def test_a_singleton_key_prefix_that_cannot_start_a_lock_name_is_refused_naming_it() -> None:
    with pytest.raises(LockConfigurationError, match="singleton_key_prefix"):
        _ = _task_of(singleton_key_prefix="has space ").lock_options


def test_singleton_lock_expiry_is_the_queued_ttl() -> None:
    assert _task_of(singleton_lock_expiry=45).lock_options.queued_ttl == 45.0


def test_a_singleton_lock_expiry_that_is_no_number_of_seconds_is_refused_naming_it() -> None:
    with pytest.raises(LockConfigurationError, match="singleton_lock_expiry"):
        _ = _task_of(singleton_lock_expiry="soon").lock_options


def test_singleton_lock_expiry_is_not_reported_as_a_misspelt_setting() -> None:
    assert unknown_settings({"singleton_lock_expiry": 60, "singleton_lock_tll": 5}) == [
        "singleton_lock_tll"
    ]
