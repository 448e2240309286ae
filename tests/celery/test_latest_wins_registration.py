"""Policy ``replace`` and ``lock_debounce``: what is refused at registration (or from the
backend's capabilities), naming the task and the option."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from celery import Celery

from celery_singleton_lock import LockConfigurationError, LockedTask
from celery_singleton_lock.celery.worker.start_checks import check_backend_support


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("latest-cfg", set_as_current=False, broker="memory://")
    app.conf.update(singleton_lock_url="redis://127.0.0.1:1/0")  # never contacted
    app.finalize()
    yield app
    app.close()


def register(app: Celery, **options: Any) -> Any:
    def job(account_id: int) -> None:
        return None

    return app.task(name="search.reindex", base=LockedTask, shared=False, **options)(job)


def test_a_debounced_replace_task_registers_with_its_bound(app: Celery) -> None:
    options = register(
        app, on_duplicate="replace", lock_debounce=2, lock_debounce_max=4
    ).lock_options
    assert (options.on_duplicate, options.debounce, options.debounce_max) == ("replace", 2, 4)


def test_replace_with_dedupe_on_enqueue_is_refused(app: Celery) -> None:
    with pytest.raises(
        LockConfigurationError, match=r"search\.reindex.*replace.*dedupe_on_enqueue"
    ):
        register(app, on_duplicate="replace", dedupe_on_enqueue=True)


def test_replace_without_finish_records_is_refused(app: Celery) -> None:
    with pytest.raises(LockConfigurationError, match=r"search\.reindex.*lock_finished_ttl"):
        register(app, on_duplicate="replace", lock_finished_ttl=None)


def test_a_debounce_with_another_policy_is_refused(app: Celery) -> None:
    app.conf.result_backend = "redis://127.0.0.1:1/1"  # what join needs besides: never contacted
    with pytest.raises(
        LockConfigurationError, match=r"search\.reindex: lock_debounce=2.*on_duplicate='join'"
    ):
        register(app, on_duplicate="join", lock_debounce=2)


def test_a_debounce_bound_without_a_debounce_is_refused(app: Celery) -> None:
    with pytest.raises(LockConfigurationError, match=r"lock_debounce_max=4.*lock_debounce is"):
        register(app, on_duplicate="replace", lock_debounce_max=4)


def test_a_debounce_bound_shorter_than_the_debounce_is_refused(app: Celery) -> None:
    with pytest.raises(LockConfigurationError, match=r"lock_debounce_max=1 is out of range"):
        register(app, on_duplicate="replace", lock_debounce=2, lock_debounce_max=1)


def test_a_debounce_that_is_not_a_number_of_seconds_is_refused(app: Celery) -> None:
    with pytest.raises(LockConfigurationError, match=r"lock_debounce must be None or a number"):
        register(app, on_duplicate="replace", lock_debounce="2s")


def test_replace_is_refused_on_a_redlock_quorum(app: Celery) -> None:
    app.conf.singleton_lock_url = [f"redis://127.0.0.1:{port}/0" for port in (1, 2, 3)]
    with pytest.raises(
        LockConfigurationError, match=r"search\.reindex: on_duplicate='replace'.*Redlock quorum"
    ):
        register(app, on_duplicate="replace")


def test_replace_is_refused_at_worker_start_on_a_redis_cluster(app: Celery) -> None:
    register(app, on_duplicate="replace", lock_debounce=1)
    app.conf.singleton_lock_cluster = True
    with pytest.raises(
        LockConfigurationError, match=r"search\.reindex: on_duplicate='replace'.*Redis Cluster"
    ):
        check_backend_support(app)
