"""``lock_group``: what registration refuses, naming the task and the option, and what the
worker's start check refuses when the tasks of one group disagree on the lock they share
(``check_configuration``, the function the worker's bootstep calls; the refusal of a real
worker is in tests/celery/test_worker_start.py)."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_singleton_lock import LockConfigurationError, LockedTask
from celery_singleton_lock.celery.worker.start_checks import check_configuration
from tests.celery.registration import register


def charge_and_refund(app: Celery, charge: dict[str, Any], refund: dict[str, Any]) -> None:
    """``billing.charge(tenant, amount)`` and ``billing.refund(tenant, order)`` registered
    on ``app`` in group ``payments`` with ``lock_on=("tenant",)``, each with its own options.
    Not ``api``: the tasks of tests/celery/tasks/groups.py are shared tasks, which Celery adds
    to every app finalized after their import, this one included."""

    def charge_body(tenant: str, amount: int) -> None:
        return None

    def refund_body(tenant: str, order: str) -> None:
        return None

    for name, body, options in (("charge", charge_body, charge), ("refund", refund_body, refund)):
        app.task(
            name=f"billing.{name}",
            base=LockedTask,
            shared=False,
            **{"lock_group": "payments", "lock_on": ("tenant",), **options},
        )(body)


# -- registration ---------------------------------------------------------------------------


def test_a_group_registers_and_heads_the_lock_name(registration_app: Celery) -> None:
    task = register(registration_app, lock_group="billing", lock_on=("account_id",))
    assert task.lock_options.keyer.name((7,), {}).startswith("billing:")


def test_lock_group_defaults_to_none_and_the_task_heads_the_name(registration_app: Celery) -> None:
    task = register(registration_app)
    assert task.lock_options.keyer.group is None
    assert task.lock_options.keyer.name((7,), {}).startswith("billing.job:")


@pytest.mark.parametrize("bad", ["", 5, ("api",), b"api"])
def test_a_group_that_is_no_non_empty_string_is_refused(registration_app: Celery, bad: Any) -> None:
    with pytest.raises(
        LockConfigurationError, match=r"billing\.job: lock_group must be None or a non-empty"
    ):
        register(registration_app, lock_group=bad)


@pytest.mark.parametrize("bad", ["has space", "a{b}", "tab\there"])
def test_a_group_that_cannot_head_a_lock_name_is_refused(
    registration_app: Celery, bad: str
) -> None:
    with pytest.raises(LockConfigurationError, match=r"billing\.job: lock_group=.*braces"):
        register(registration_app, lock_group=bad)


@pytest.mark.parametrize("policy", ["join", "replace"])
def test_a_group_with_a_policy_answering_for_another_call_is_refused(
    registration_app: Celery, policy: str
) -> None:
    with pytest.raises(
        LockConfigurationError, match=rf"billing\.job: lock_group does not combine with.*'{policy}'"
    ):
        register(registration_app, lock_group="api", on_duplicate=policy)


def test_an_empty_lock_on_registers_as_one_lock_for_every_call(registration_app: Celery) -> None:
    task = register(registration_app, lock_on=())
    keyer = task.lock_options.keyer
    assert keyer.name((1,), {}) == keyer.name((2,), {})


# -- worker start: the tasks of a group agree -----------------------------------------------


def test_tasks_of_a_group_declaring_the_same_limits_pass_the_start_check(
    registration_app: Celery,
) -> None:
    same = {"lock_limit": 2, "lock_rate": "5/s", "on_duplicate": "skip"}
    charge_and_refund(registration_app, same, {**same, "on_duplicate": "retry"})
    check_configuration(registration_app)


@pytest.mark.parametrize(
    ("option", "charge", "refund"),
    [
        ("lock_limit", {"lock_limit": 2}, {"lock_limit": 3}),
        ("lock_cooldown", {"lock_cooldown": 5}, {}),
        (
            "lock_cooldown_after",
            {"lock_cooldown": 5},
            {"lock_cooldown": 5, "lock_cooldown_after": "always"},
        ),
        ("lock_rate", {"lock_rate": "5/s"}, {"lock_rate": "5/m"}),
        ("on_duplicate", {"on_duplicate": "queue"}, {"on_duplicate": "skip"}),
        ("lock_on", {}, {"lock_on": ()}),
    ],
)
def test_tasks_of_a_group_declaring_different_limits_are_refused_at_worker_start(
    registration_app: Celery, option: str, charge: dict[str, Any], refund: dict[str, Any]
) -> None:
    charge_and_refund(registration_app, charge, refund)
    with pytest.raises(LockConfigurationError) as refused:
        check_configuration(registration_app)
    said = refused.value.message
    assert "lock_group 'payments'" in said and f"different {option} " in said
    assert "billing.charge" in said and "billing.refund" in said


def test_tasks_of_different_groups_may_declare_different_limits(registration_app: Celery) -> None:
    charge_and_refund(registration_app, {"lock_limit": 2}, {"lock_limit": 3, "lock_group": "other"})
    check_configuration(registration_app)
