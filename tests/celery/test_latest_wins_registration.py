"""Policy ``replace`` and ``lock_debounce``: what is refused at registration (or from the
backend's capabilities), naming the task and the option."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_singleton_lock import LockConfigurationError
from celery_singleton_lock.celery.config.backend_support import refuse_unsupported, requested
from celery_singleton_lock.engine import CLUSTER
from tests.celery.registration import register


def test_a_debounced_replace_task_registers_with_its_bound(registration_app: Celery) -> None:
    app = registration_app
    options = register(
        app, on_duplicate="replace", lock_debounce=2, lock_debounce_max=4
    ).lock_options
    assert (options.on_duplicate, options.debounce, options.debounce_max) == ("replace", 2, 4)


def test_replace_with_dedupe_on_enqueue_is_refused(registration_app: Celery) -> None:
    app = registration_app
    with pytest.raises(LockConfigurationError, match=r"billing\.job.*replace.*dedupe_on_enqueue"):
        register(app, on_duplicate="replace", dedupe_on_enqueue=True)


def test_replace_without_finish_records_is_refused(registration_app: Celery) -> None:
    app = registration_app
    with pytest.raises(LockConfigurationError, match=r"billing\.job.*lock_finished_ttl"):
        register(app, on_duplicate="replace", lock_finished_ttl=None)


def test_a_debounce_with_another_policy_is_refused(registration_app: Celery) -> None:
    app = registration_app
    with pytest.raises(
        LockConfigurationError, match=r"billing\.job: lock_debounce=2.*on_duplicate='join'"
    ):
        register(app, on_duplicate="join", lock_debounce=2)


def test_a_debounce_bound_without_a_debounce_is_refused(registration_app: Celery) -> None:
    app = registration_app
    with pytest.raises(LockConfigurationError, match=r"lock_debounce_max=4.*lock_debounce is"):
        register(app, on_duplicate="replace", lock_debounce_max=4)


def test_a_debounce_bound_shorter_than_the_debounce_is_refused(registration_app: Celery) -> None:
    app = registration_app
    with pytest.raises(
        LockConfigurationError, match=r"lock_debounce_max=1 must be at least lock_debounce=2:"
    ):
        register(app, on_duplicate="replace", lock_debounce=2, lock_debounce_max=1)


def test_a_debounce_that_is_not_a_number_of_seconds_is_refused(registration_app: Celery) -> None:
    app = registration_app
    with pytest.raises(LockConfigurationError, match=r"lock_debounce must be None or a number"):
        register(app, on_duplicate="replace", lock_debounce="2s")


@pytest.mark.parametrize("policy", ["replace", "restart"])
def test_latest_wins_is_refused_on_a_redlock_quorum(registration_app: Celery, policy: str) -> None:
    app = registration_app
    app.conf.singleton_lock_url = [f"redis://127.0.0.1:{port}/0" for port in (1, 2, 3)]
    with pytest.raises(
        LockConfigurationError, match=rf"billing\.job: on_duplicate='{policy}'.*Redlock quorum"
    ):
        register(app, on_duplicate=policy)


def test_a_debounce_is_served_on_a_redis_cluster(registration_app: Celery) -> None:
    # what the worker start (start_checks.check_backend_support) asks of each locked task
    task = register(registration_app, on_duplicate="replace", lock_debounce=1)
    refuse_unsupported(task.name, requested(task.lock_options), CLUSTER)  # nothing refused


@pytest.mark.parametrize("policy", ["replace", "restart"])
def test_the_newest_call_wins_on_a_redis_cluster(registration_app: Celery, policy: str) -> None:
    task = register(registration_app, on_duplicate=policy)
    refuse_unsupported(task.name, requested(task.lock_options), CLUSTER)  # nothing refused


@pytest.mark.parametrize(
    "options",
    [{}, {"lock_limit": 3}, {"lock_fair_by": ("account_id",)}, {"lock_rate": "2/s"}],
    ids=["mutex", "limit", "fair", "rate"],
)
def test_the_queue_is_served_on_a_redis_cluster(
    registration_app: Celery, options: dict[str, object]
) -> None:
    task = register(registration_app, on_duplicate="queue", **options)
    refuse_unsupported(task.name, requested(task.lock_options), CLUSTER)  # nothing refused
