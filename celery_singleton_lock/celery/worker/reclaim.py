"""Freeing the lock of a pool child that died (``kill -9``, a hard time limit,
``terminate``) from the worker's main process, and handing it on: as soon as the renewal
supervisor sees the child gone (:mod:`.child_renewal`), and again when Celery reports the death
(a no-op by then, unless the supervisor could not reach the lock server).

Only a lock whose owner metadata names the dead execution (task id, this node, a pid that
is gone) is freed, atomically, by the engine's abandoned-lease release."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Optional

from celery_singleton_lock.celery.config.limits import limit_for
from celery_singleton_lock.celery.config.lockers import locker_for
from celery_singleton_lock.celery.duplicates import parking as handoff
from celery_singleton_lock.celery.signals import lock_released
from celery_singleton_lock.celery.task.locked_task import LockedTask
from celery_singleton_lock.engine import no_fork, slot_of
from celery_singleton_lock.errors import LockError

log = logging.getLogger("celery_singleton_lock.worker")

#: Seconds the main process waits for a dead/killed child's pid to disappear.
RECLAIM_WAIT = 5.0


def drop_discarded_parked_call(task: LockedTask, request: Any) -> None:
    try:
        name = task.lock_options.keyer.name(tuple(request.args or ()), dict(request.kwargs or {}))
    except LockError as exc:  # its message could not have been parked either
        log.debug("task %s[%s]: no lock name (%s)", task.name, request.id, exc)
        return
    if handoff.drop(task.app, name, request.id):
        log.info(
            "task %s[%s] was parked and discarded (revoked or expired); lock %s handed on",
            task.name,
            request.id,
            locker_for(task.app).keys(name).lock,
        )


def reclaim_in_background(
    task: LockedTask, task_id: Optional[str], args: Any, kwargs: Any, node: Optional[str]
) -> None:
    if not task_id or not node:
        return
    thread = threading.Thread(
        target=reclaim_dead_holder,
        args=(task, task_id, args, kwargs, node),
        name="celery-singleton-lock-reclaim",
        daemon=True,
    )
    thread.start()


def pid_is_gone(pid: int) -> bool:
    """True once ``pid`` no longer runs here (exited, or a zombie waiting to be reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return False


def reclaim_dead_holder(task: LockedTask, task_id: str, args: Any, kwargs: Any, node: str) -> bool:
    """Free the lock a dead child of this worker held for ``task_id``; True if freed."""
    options = task.lock_options
    try:
        name = options.keyer.name(args, kwargs)
        limit = limit_for(task.name, options.limit, options.keyer, args, kwargs)
    except LockError as exc:  # the child failed the same way, holding nothing
        log.debug("task %s[%s]: no lock name (%s)", task.name, task_id, exc)
        return False
    return free_dead_holder(task, locker_for(task.app), name, limit, task_id, node)


def free_dead_holder(
    task: LockedTask,
    locker: Any,
    name: str,
    limit: int,
    task_id: str,
    node: str,
    wait: float = RECLAIM_WAIT,
) -> bool:
    """Free lock ``name`` (one of its ``limit`` slots) held for ``task_id`` by a process of
    this node, once that pid is gone (waiting up to ``wait`` seconds), and hand it on: the
    release publishes on the lock's channel (``wait`` duplicates wake) and the policy sends a
    parked call now, not at the dead holder's TTL. True if freed.

    Only a lock whose owner metadata names this very execution (task id, this node, a pid
    that is gone) is deleted, atomically, by the ``RELEASE_ABANDONED`` script.
    """
    try:
        deadline = time.monotonic() + wait
        while True:
            holder = _held_by(locker, name, limit, task_id, node)
            if holder is None:
                return False  # released by its body, freed already, or never taken
            if holder.pid is not None and pid_is_gone(holder.pid):
                break
            if time.monotonic() > deadline:
                log.warning(
                    "task %s[%s]: holder pid %s of %s still alive after %.0fs; leaving the lock "
                    "to its TTL",
                    task.name,
                    task_id,
                    holder.pid,
                    holder.key,
                    wait,
                )
                return False
            time.sleep(0.05)
        freed = locker.release_abandoned(
            name, task_id=task_id, host=node, pid=holder.pid, slot=slot_of(holder.key)
        )
        if freed:
            log.warning(
                "task %s[%s]: freed lock %s left by dead process %s",
                task.name,
                task_id,
                holder.key,
                holder.pid,
            )
            task.lock_options.policy.reclaimed(task, locker, name)
            if lock_released.receivers:
                with no_fork:  # Celery's Signal takes a lock (see parking.publish)
                    lock_released.send(
                        sender=task, task_id=task_id, key=holder.key, owned=True, reclaimed=True
                    )
        return bool(freed)
    except LockError as exc:
        log.error("task %s[%s]: could not reclaim its lock: %s", task.name, task_id, exc)
        return False


def _held_by(locker: Any, name: str, limit: int, task_id: str, node: str) -> Any:
    """The holder of lock ``name`` (of one of its ``limit`` slots) that is ``task_id`` on
    ``node``; None if there is none."""
    holders = [locker.inspect.read(name)] if limit == 1 else locker.inspect.holders(name, limit)
    for holder in holders:
        if holder is not None and holder.task_id == task_id and holder.host == node:
            return holder
    return None
