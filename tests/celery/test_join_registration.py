"""``on_duplicate="join"`` needs the task's results stored: refused at registration otherwise."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_singleton_lock import LockConfigurationError
from tests.celery.registration import app_with, register


def test_join_task_with_a_result_backend_registers(registration_app: Celery) -> None:
    app = registration_app
    assert register(app, on_duplicate="join").lock_options.on_duplicate == "join"


def test_join_task_ignoring_its_results_fails_at_registration(registration_app: Celery) -> None:
    app = registration_app
    with pytest.raises(LockConfigurationError, match=r"billing\.job.*join.*ignore_result=True"):
        register(app, on_duplicate="join", ignore_result=True)


def test_join_task_of_an_app_ignoring_results_fails_at_registration() -> None:
    app = app_with(result_backend="cache+memory://", task_ignore_result=True)
    with pytest.raises(LockConfigurationError, match=r"billing\.job.*ignore_result=True"):
        register(app, on_duplicate="join")
    app.close()


def test_join_task_of_an_app_without_a_result_backend_fails_at_registration() -> None:
    app = app_with()
    with pytest.raises(LockConfigurationError, match=r"billing\.job.*join.*result backend"):
        register(app, on_duplicate="join")
    app.close()


def test_join_as_the_app_wide_policy_is_checked_too() -> None:
    # other tests' shared tasks may be bound first when the app finalizes: any of them names it
    with pytest.raises(LockConfigurationError, match=r"on_duplicate='join' needs a result backend"):
        app = app_with(singleton_lock_on_duplicate="join")
        register(app)
