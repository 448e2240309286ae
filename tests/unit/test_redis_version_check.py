"""The lock server's Redis version against what a task's policy needs (bug 6): read as numbers,
and refused, as the worker starts, only when older than a registered task's policy needs.
tests/celery/test_worker_start.py has the check on a real worker."""

from __future__ import annotations

import pytest

from celery_singleton_lock.celery.worker.server_probe import parse_version
from celery_singleton_lock.celery.worker.start_checks import refuse_too_old
from celery_singleton_lock.errors import LockConfigurationError

REPLACING = [("proj.tasks.rebuild", "replace")]


@pytest.mark.parametrize(
    ("text", "version"),
    [("7.0.15", (7, 0, 15)), ("6.2.0", (6, 2, 0)), ("6.0", (6, 0)), ("255.255.255", (255,) * 3)],
)
def test_the_version_is_read_as_numbers(text: str, version: tuple[int, ...]) -> None:
    assert parse_version(text) == version


@pytest.mark.parametrize("text", [None, "", "7.0.x", "unstable"])
def test_a_version_that_is_no_numbers_is_not_known(text: object) -> None:
    assert parse_version(text) is None


def test_replace_on_a_redis_older_than_6_2_is_refused_naming_task_option_version_and_fix() -> None:
    with pytest.raises(LockConfigurationError) as refused:
        refuse_too_old(REPLACING, "127.0.0.1:6379", (6, 0, 16))
    message = str(refused.value)
    assert message.startswith("task proj.tasks.rebuild: on_duplicate='replace' needs Redis >= 6.2")
    assert "ZADD GT/LT and LPOS" in message
    assert "lock server 127.0.0.1:6379 runs Redis 6.0.16" in message
    assert "upgrade the lock server" in message and "choose another on_duplicate" in message


@pytest.mark.parametrize("version", [(6, 2, 0), (6, 2), (7, 0, 15), None])
def test_replace_on_redis_6_2_or_later_or_a_version_not_known_is_not_refused(
    version: tuple[int, ...] | None,
) -> None:
    refuse_too_old(REPLACING, "127.0.0.1:6379", version)


def test_no_task_that_needs_a_newer_redis_refuses_nothing() -> None:
    refuse_too_old([], "127.0.0.1:6379", (2, 8))
