"""``locks show`` names the call waiting behind a lock for what it is: the newest call waiting to
replace the holder (policy ``replace``), a debounced call held back until its due time, or
calls parked in arrival order (policy ``queue``)."""

from __future__ import annotations

import re

from celery_singleton_lock.engine import Latest, Owner, Parked, RedisLocker, Renewer
from celery_singleton_lock.testing import RedisServer
from tests.celery.test_cli import run_cli


def _wait(locker: RedisLocker, name: str, task_id: str, debounce: float = 0.0) -> None:
    outcome = locker.try_acquire(
        name,
        30,
        owner=Owner(task_id=task_id),
        renew=False,
        park=f"{task_id}\n{{}}".encode(),
        latest=Latest(debounce),
    )
    assert isinstance(outcome, Parked)


def test_show_names_only_the_newest_call_waiting_behind_a_held_lock(
    redis_server: RedisServer,
) -> None:
    locker = RedisLocker(redis_server.client(), renewer=Renewer(autostart=False))
    locker.try_acquire("app.job:r", 30, owner=Owner(task_id="t-h", host="w@h", pid=7))
    for task_id in ("t-1", "t-2", "t-3"):
        _wait(locker, "app.job:r", task_id)
    shown = run_cli("--url", redis_server.url, "show", "app.job:r")
    assert shown.returncode == 0, shown.stderr
    assert "waiting to replace (the newest call, it runs when the lock is free): t-3" in (
        shown.stdout
    )


def test_show_names_a_debounced_call_held_on_a_free_lock(redis_server: RedisServer) -> None:
    locker = RedisLocker(redis_server.client(), renewer=Renewer(autostart=False))
    _wait(locker, "app.job:d", "t-d", debounce=60)
    shown = run_cli("--url", redis_server.url, "show", "app.job:d")
    assert "free" in shown.stdout  # (and its exit status says so)
    assert re.search(
        r"held back until \S+ \(debounce, in \d+\.\ds\), newest call: t-d", shown.stdout
    )


def test_show_says_parked_of_calls_queued_in_arrival_order(redis_server: RedisServer) -> None:
    locker = RedisLocker(redis_server.client(), renewer=Renewer(autostart=False))
    holder = Owner(task_id="t-h", host="w@h", pid=7)
    locker.try_acquire("app.job:q", 30, owner=holder, slotted=True)  # a queue task's lock
    for task_id in ("t-1", "t-2"):
        locker.try_acquire(
            "app.job:q",
            30,
            owner=Owner(task_id=task_id),
            renew=False,
            park=b"%s\n{}" % task_id.encode(),
        )
    shown = run_cli("--url", redis_server.url, "show", "app.job:q")
    assert "parked: 2 call(s), oldest first: t-1 t-2" in shown.stdout
