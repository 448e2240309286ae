"""celery-once's settings under ``compat.QueueOnce``: an app that kept its locks in files, or
on celery-once's own Redis (``ONCE["settings"]["url"]``), may name no Redis of its own. With
no ``singleton_lock_url`` and no Redis broker or result backend, its calls are refused with a
configuration error naming the setting to give, instead of sending the locks to whatever
answers on the default localhost:6379 (or raising ``LockBackendUnavailable`` at every
``delay()``)."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from celery import Celery

from celery_singleton_lock.celery.worker.start_checks import check_configuration
from celery_singleton_lock.compat import QueueOnce
from celery_singleton_lock.errors import LockConfigurationError

FILE_BACKEND = {"backend": "celery_once.backends.File", "settings": {"location": "/nowhere"}}


def app_with(**settings: Any) -> Celery:
    app = Celery("once-file", set_as_current=False)
    app.conf.update(ONCE=FILE_BACKEND, **settings)
    return app


@pytest.fixture
def apps() -> Iterator[list[Celery]]:
    made: list[Celery] = []
    yield made
    for app in made:
        app.close()


def once_task(app: Celery) -> Any:
    @app.task(base=QueueOnce, shared=False, once={"keys": ["a"]})
    def job(a: int) -> int:
        return a

    return job


def test_a_file_backend_app_with_no_redis_is_refused_at_delay(apps: list[Celery]) -> None:
    apps.append(app := app_with(broker_url="amqp://127.0.0.1:1//"))
    with pytest.raises(LockConfigurationError) as info:
        once_task(app).delay(1)
    assert "celery_once.backends.File" in info.value.message
    assert "set singleton_lock_url" in info.value.message


def test_a_file_backend_app_with_no_redis_is_refused_at_worker_start(apps: list[Celery]) -> None:
    apps.append(app := app_with(broker_url="amqp://127.0.0.1:1//"))
    once_task(app)
    with pytest.raises(LockConfigurationError, match="set singleton_lock_url"):
        check_configuration(app)


def test_a_redis_backend_app_with_no_redis_of_its_own_is_refused_naming_the_setting(
    apps: list[Celery],
) -> None:
    apps.append(app := app_with(broker_url="amqp://127.0.0.1:1//"))
    app.conf.ONCE = {
        "backend": "celery_once.backends.Redis",
        "settings": {"url": "redis://:secret@locks.example:6379/0"},
    }
    with pytest.raises(LockConfigurationError) as info:
        once_task(app).delay(1)
    assert "is celery-once's, not read here" in info.value.message
    assert "set singleton_lock_url" in info.value.message and "secret" not in info.value.message


@pytest.mark.parametrize(
    "settings",
    [
        {"broker_url": "amqp://127.0.0.1:1//", "singleton_lock_url": "redis://127.0.0.1:1/0"},
        {"broker_url": "redis://127.0.0.1:1/0"},
    ],
    ids=["singleton_lock_url", "redis broker"],
)
def test_a_file_backend_app_that_names_a_redis_takes_its_locks_there(
    apps: list[Celery], settings: dict[str, str]
) -> None:
    apps.append(app := app_with(**settings))
    assert once_task(app).lock_options.keyer.name((1,), {})
