"""``lock_limit`` (and what ``lock_rate`` does not combine with): what is refused at
registration, naming the task and the option, and saying why."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_singleton_lock import LockConfigurationError
from celery_singleton_lock.celery.config.limits import limit_for
from tests.celery.registration import register


def test_a_limit_of_3_registers(registration_app: Celery) -> None:
    assert register(registration_app, lock_limit=3).lock_options.limit == 3


def test_the_limit_defaults_to_1(registration_app: Celery) -> None:
    assert register(registration_app).lock_options.limit == 1


def test_the_limit_comes_from_the_app_setting(registration_app: Celery) -> None:
    registration_app.conf.singleton_lock_limit = 4
    assert register(registration_app).lock_options.limit == 4


@pytest.mark.parametrize("bad", [0, -2, 2.5, "3", True, None])
def test_a_limit_that_is_no_integer_of_at_least_1_is_refused(
    registration_app: Celery, bad: Any
) -> None:
    with pytest.raises(
        LockConfigurationError, match=r"billing\.job: lock_limit must be an integer"
    ):
        register(registration_app, lock_limit=bad)


@pytest.mark.parametrize("policy", ["join", "replace"])
def test_a_limit_above_1_with_a_one_holder_policy_is_refused(
    registration_app: Celery, policy: str
) -> None:
    with pytest.raises(LockConfigurationError, match=rf"billing\.job: lock_limit=2.*'{policy}'"):
        register(registration_app, lock_limit=2, on_duplicate=policy)


def test_a_limit_above_1_with_dedupe_on_enqueue_is_refused(registration_app: Celery) -> None:
    with pytest.raises(LockConfigurationError, match=r"lock_limit=2.*dedupe_on_enqueue"):
        register(registration_app, lock_limit=2, dedupe_on_enqueue=True)


def test_a_callable_limit_with_join_is_refused(registration_app: Celery) -> None:
    with pytest.raises(LockConfigurationError, match=r"billing\.job: lock_limit=.*'join'"):
        register(registration_app, lock_limit=lambda account_id: 2, on_duplicate="join")


def test_a_limit_above_1_is_refused_on_a_quorum(registration_app: Celery) -> None:
    registration_app.conf.singleton_lock_url = [f"redis://127.0.0.1:{port}/0" for port in (1, 2, 3)]
    with pytest.raises(LockConfigurationError, match=r"billing\.job: lock_limit=2.*Redlock quorum"):
        register(registration_app, lock_limit=2)


@pytest.mark.parametrize(
    "options", [{"lock_limit": 3}, {"lock_rate": "3/10s"}, {"lock_cooldown": 2}]
)
def test_queue_registers_with_a_limit_a_rate_or_a_cooldown(
    registration_app: Celery, options: dict[str, object]
) -> None:
    task = register(registration_app, on_duplicate="queue", **options)
    assert task.lock_options.on_duplicate == "queue"


def test_replace_with_a_limit_is_refused_naming_queue_as_the_way(
    registration_app: Celery,
) -> None:
    with pytest.raises(LockConfigurationError, match=r"lock_limit=2.*on_duplicate='queue' runs"):
        register(registration_app, lock_limit=2, on_duplicate="replace")


def test_a_limit_with_join_says_why_in_parentheses(registration_app: Celery) -> None:
    with pytest.raises(
        LockConfigurationError,
        match=r"lock_limit=2 does not combine with on_duplicate='join' \(a join waits for .*\); "
        "choose one of the two",
    ):
        register(registration_app, lock_limit=2, on_duplicate="join")


def test_a_rate_with_dedupe_on_enqueue_says_what_to_do_instead(registration_app: Celery) -> None:
    with pytest.raises(LockConfigurationError, match=r"not supported: .*on_duplicate='skip'"):
        register(registration_app, lock_rate="3/m", dedupe_on_enqueue=True)


def test_a_callable_limit_returning_0_says_it_must_return_an_integer(
    registration_app: Celery,
) -> None:
    task = register(registration_app, lock_limit=lambda account_id: 0)
    keyer = task.lock_options.keyer
    with pytest.raises(LockConfigurationError, match=r"lock_limit's callable must return an int"):
        limit_for(task.name, task.lock_options.limit, keyer, [7], {})


def test_lock_fair_by_registers_with_queue_and_gives_each_value_its_own_fairness(
    registration_app: Celery,
) -> None:
    options = register(
        registration_app, on_duplicate="queue", lock_fair_by=("account_id",)
    ).lock_options
    assert options.fair_value((1,), {}) == options.fair_value((), {"account_id": 1})
    assert options.fair_value((1,), {}) != options.fair_value((2,), {})


def test_without_lock_fair_by_a_call_has_no_fairness_value(registration_app: Celery) -> None:
    assert register(registration_app, on_duplicate="queue").lock_options.fair_value((1,), {}) == ""


def test_lock_fair_by_naming_no_parameter_of_the_task_is_refused_naming_it(
    registration_app: Celery,
) -> None:
    with pytest.raises(
        LockConfigurationError, match=r"billing\.job: lock_fair_by names \['tenant'\]"
    ):
        register(registration_app, on_duplicate="queue", lock_fair_by=("tenant",))


@pytest.mark.parametrize("policy", ["skip", "retry", "replace"])
def test_lock_fair_by_without_a_queue_is_refused(registration_app: Celery, policy: str) -> None:
    with pytest.raises(LockConfigurationError, match=r"lock_fair_by.*on_duplicate='queue'"):
        register(registration_app, on_duplicate=policy, lock_fair_by=("account_id",))
