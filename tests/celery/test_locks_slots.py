"""``celery -A tests.celery.lockapp locks ...`` on the slots of a lock_limit: every key form
``list`` prints is accepted by ``show`` and ``release``, each slot can be released (owner-
checked), and the command ``doctor`` suggests for an orphaned slot is the one that frees it.

Real ``celery`` subprocesses against real Redis servers (the fixtures of
tests/celery/test_celery_locks.py); the slots are held by the engine for a worker node that
does not exist, so no node answers its ping, as after ``kill -9`` of the worker.
"""

# The fixtures of test_celery_locks.py are imported by name: each test argument names one.
# ruff: noqa: F811

from __future__ import annotations

import hashlib
import shlex

import pytest
import redis

from celery_singleton_lock.engine import Owner, RedisLocker, Renewer
from tests.celery.test_celery_locks import (  # noqa: F401 - the fixtures
    APP,
    Celery,
    celery_process,
    entry_points_dir,
    lock_store,
    no_traceback,
    servers,
    the_error,
)
from tests.celery.workers import unique


@pytest.fixture(scope="module")
def celery(celery_process: Celery) -> Celery:
    """This module's runs, one by one (test_celery_locks.py's start some side by side)."""
    return celery_process


#: a node no worker answers pings as
GONE = "gone@nowhere"


@pytest.fixture
def locker(lock_store: redis.Redis) -> RedisLocker:
    return RedisLocker(lock_store, renewer=Renewer(autostart=False))


@pytest.fixture
def name() -> str:
    """A name shaped as a task's lock name (TASKNAME:DIGEST): with an app, the commands refuse
    any other that is free."""
    return f"app.job:{hashlib.sha256(unique('n').encode()).hexdigest()}"


def three_slots(locker: RedisLocker, name: str) -> list[str]:
    """Take the 3 slots of ``name`` (lock_limit=3) for 3 runs on the node that is gone, as a
    killed worker leaves them; their keys, slot 1 first."""
    for pid in (101, 102, 103):
        owner = Owner(task_id=f"t-{pid}", host=GONE, pid=pid)
        locker.try_acquire(name, 60, owner=owner, limit=3, renew=False)
    lock = locker.keys(name).lock
    return [lock, f"{lock}:slot:2", f"{lock}:slot:3"]


def held(locker: RedisLocker, name: str, keys: list[str]) -> list[bool]:
    """Which of ``keys`` (slot names, slot 1 first) are held, read through the reading API."""
    taken = {holder.key for holder in locker.inspect.holders(name, len(keys))}
    return [key in taken for key in keys]


@pytest.mark.parametrize(
    ("given", "freed"),
    [
        (["{key2}"], 2),  # the slot's key, as list shows it
        (["{name}", "--slot", "3"], 3),
        (["{name}:slot:2"], 2),
    ],
    ids=["slot-key", "slot-option", "name-colon-slot"],
)
def test_release_of_one_slot_frees_that_slot_only(
    celery: Celery,
    locker: RedisLocker,
    lock_store: redis.Redis,
    name: str,
    given: list[str],
    freed: int,
) -> None:
    keys = three_slots(locker, name)
    args = [word.format(name=name, key2=keys[1]) for word in given]
    result = no_traceback(celery("locks", "release", *args, "--ping-timeout", "0.5"))
    assert result.returncode == 0, result.stderr
    assert held(locker, name, keys) == [slot != freed for slot in (1, 2, 3)]


def test_release_says_which_slot_it_released_and_whose_it_was(
    celery: Celery,
    locker: RedisLocker,
    name: str,
) -> None:
    keys = three_slots(locker, name)
    result = no_traceback(celery("locks", "release", keys[2], "--ping-timeout", "0.5"))
    assert result.stdout.startswith(f"{keys[2]}: released (held by task t-103 on node {GONE}")


def test_release_of_a_slot_key_and_another_slot_option_is_one_error_line(
    celery: Celery,
    locker: RedisLocker,
    name: str,
) -> None:
    keys = three_slots(locker, name)
    line = the_error(celery("locks", "release", keys[1], "--slot", "3"))
    assert "slot 2" in line and "--slot 3" in line


def test_release_of_a_free_first_slot_names_the_slots_still_held(
    celery: Celery,
    locker: RedisLocker,
    lock_store: redis.Redis,
    name: str,
) -> None:
    three_slots(locker, name)
    # slot 1 released, as `release NAME` would
    assert locker.release_abandoned(name, task_id="t-101", host=GONE, pid=101, slot=1)
    result = no_traceback(celery("locks", "release", name, "--ping-timeout", "0.5"))
    assert result.returncode == 1, result.stderr
    assert "slots 2, 3 of it are held" in result.stdout and "--slot 2" in result.stdout


def test_show_of_a_slot_key_shows_every_slot_of_its_lock(
    celery: Celery,
    locker: RedisLocker,
    name: str,
) -> None:
    keys = three_slots(locker, name)
    result = no_traceback(celery("locks", "show", keys[2]))
    assert result.returncode == 0, result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines()] == keys


def test_doctor_suggests_for_each_orphaned_slot_a_command_that_releases_it(
    celery: Celery,
    locker: RedisLocker,
    lock_store: redis.Redis,
    name: str,
) -> None:
    keys = three_slots(locker, name)
    report = no_traceback(celery("locks", "doctor", "--ping-timeout", "0.5")).stdout
    fixes = [
        line.split("; fix: ", 1)[1].removesuffix(" (or wait for its TTL)")
        for line in report.splitlines()
        if line.startswith("WARNING orphans") and name in line
    ]
    assert len(fixes) == 3, report
    for fix in fixes:
        words = shlex.split(fix)
        assert words[:4] == ["celery", "-A", APP, "locks"], fix
        no_traceback(celery(*words[3:], "--ping-timeout", "0.5"))
    assert held(locker, name, keys) == [False, False, False]


# -- show of a free lock ------------------------------------------------------------------------


def test_show_of_a_name_no_task_takes_is_refused_once_a_fence_was_handed_out(
    celery: Celery, locker: RedisLocker, name: str
) -> None:
    """Fences come from one counter per server: a fence handed out for any lock must not make
    a typo'd name look like a lock of its own."""
    locker.try_acquire(name, 60, owner=Owner(task_id="t-f"), fencing=True, renew=False)
    line = the_error(celery("locks", "show", "not-a-lock-name"))
    assert "'not-a-lock-name' is not a lock name" in line


def test_show_of_a_free_lock_says_free_and_no_fence_of_the_servers_counter(
    celery: Celery, locker: RedisLocker, name: str
) -> None:
    locker.try_acquire(f"{name}0", 60, owner=Owner(task_id="t-f"), fencing=True, renew=False)
    result = no_traceback(celery("locks", "show", name))
    assert (result.returncode, result.stdout) == (1, f"singleton-lock:{{{name}}}: free\n")
