"""Worker-side hooks, wired to Celery's own signals when this package is imported.

* ``task_failure`` (``WorkerLostError``, hard ``TimeLimitExceeded``) and ``task_revoked``
  (``terminate=True``), sent in the worker's MAIN process: the child that held the lock is
  dead or being killed, so the main process frees the lock by owner (task id, node, pid)
  once that pid is gone.
* ``task_revoked`` of a message discarded before it ran (revoked, expired): its queued marker
  (``dedupe_on_enqueue``) is removed, by task id, so the next call is published; a parked
  call (policy ``queue``) is taken out of the parked ones and, if the lock was reserved for
  it, the lock is handed to the next parked call at once.
* ``worker_init``: a worker with an invalid lock configuration will not start;
  ``worker_ready``: log the lock server and warn if it may evict locks (see :mod:`.startup`).
* ``worker_ready`` with tasks of policy ``queue``: start the hand-off sweeper in the main
  process (see :mod:`.handoff`); ``worker_shutdown`` stops it.
* ``worker_process_shutdown`` / ``worker_shutdown``: release whatever this process holds.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Optional

from celery import signals
from celery.exceptions import TimeLimitExceeded, WorkerLostError

from ..errors import LockError
from . import enqueue, handoff
from .lock_server import all_lockers, locker_for
from .signals import lock_released
from .startup import install_configuration_check, locked_tasks, report_lock_server
from .task import LockedTask

log = logging.getLogger("celery_singleton_lock.worker")

#: Seconds the main process waits for a dead/killed child's pid to disappear.
RECLAIM_WAIT = 5.0

_node_name: Optional[str] = None


def _reclaim_after_child_death(
    sender: Any = None,
    task_id: Optional[str] = None,
    exception: Any = None,
    args: Any = None,
    kwargs: Any = None,
    **_: Any,
) -> None:
    if isinstance(sender, LockedTask) and isinstance(
        exception, (WorkerLostError, TimeLimitExceeded)
    ):
        request = getattr(sender, "request", None)
        node = getattr(request, "hostname", None) if task_id == getattr(request, "id", 0) else None
        _reclaim_in_background(sender, task_id, args, kwargs, node or _node_name)


def _reclaim_after_terminate(
    sender: Any = None, request: Any = None, terminated: bool = False, **_: Any
) -> None:
    if terminated and isinstance(sender, LockedTask) and request is not None:
        node = getattr(request, "hostname", None) or _node_name
        _reclaim_in_background(sender, request.id, request.args, request.kwargs, node)


def _forget_discarded_message(
    sender: Any = None, request: Any = None, terminated: bool = False, **_: Any
) -> None:
    # Also after a terminate: a compare-and-delete by task id, so at worst it finds nothing.
    if not isinstance(sender, LockedTask) or not getattr(request, "id", None):
        return
    options = sender.lock_options
    if options.dedupe_on_enqueue:
        enqueue.forget_discarded(sender, request)
    if options.on_duplicate == "queue" and not terminated:
        # a parked call handed the lock but discarded (revoked, expired) never takes it:
        # hand it on now, not when the reservation runs out (and is made for it again)
        _drop_parked(sender, request)


def _drop_parked(task: LockedTask, request: Any) -> None:
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


def _reclaim_in_background(
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
    """Free the lock a dead child of this worker held for ``task_id``; True if freed.

    Only a lock whose owner metadata names this very execution (task id, this node, a pid
    that is gone) is deleted, atomically, by the ``RELEASE_ABANDONED`` script.
    """
    try:
        name = task.lock_options.keyer.name(args, kwargs)
        locker = locker_for(task.app)
        deadline = time.monotonic() + RECLAIM_WAIT
        while True:
            holder = locker.inspect.read(name)
            if holder is None or holder.task_id != task_id or holder.host != node:
                return False
            if holder.pid is not None and pid_is_gone(holder.pid):
                freed = locker.release_abandoned(name, task_id=task_id, host=node, pid=holder.pid)
                if freed:
                    log.warning(
                        "task %s[%s]: freed lock %s left by dead process %s",
                        task.name,
                        task_id,
                        holder.key,
                        holder.pid,
                    )
                    _hand_on(task, locker, name)
                    if lock_released.receivers:
                        lock_released.send(
                            sender=task,
                            task_id=task_id,
                            key=holder.key,
                            owned=True,
                            reclaimed=True,
                        )
                return freed
            if time.monotonic() > deadline:
                log.warning(
                    "task %s[%s]: holder pid %s of %s still alive after %.0fs; leaving the lock "
                    "to its TTL",
                    task.name,
                    task_id,
                    holder.pid,
                    holder.key,
                    RECLAIM_WAIT,
                )
                return False
            time.sleep(0.05)
    except LockError as exc:
        log.error("task %s[%s]: could not reclaim its lock: %s", task.name, task_id, exc)
        return False


def _hand_on(task: LockedTask, locker: Any, name: str) -> None:
    """Policy ``queue``: hand a reclaimed lock to its oldest parked message now, rather than
    at the dead holder's TTL (when the sweeper would find it)."""
    options = task.lock_options
    if options.on_duplicate != "queue":
        return
    message = locker.hand_off_if_free(name, reservation_ttl=options.handoff_timeout)
    if message is not None:
        handoff.publish(task.app, message, name)


def _prepare_worker_start(sender: Any = None, **_: Any) -> None:
    # worker_init: too early to stop the worker or to log (see .startup); it only adds the
    # bootstep that checks the configuration once logging is set up.
    global _node_name
    app = getattr(sender, "app", None)
    if app is None:
        return
    _node_name = getattr(sender, "hostname", None) or _node_name
    install_configuration_check(app)


def _report_lock_server(sender: Any = None, **_: Any) -> None:
    # worker_ready, not worker_init: Celery sets up its logging in between.
    app = getattr(sender, "app", None)
    if app is not None:
        report_lock_server(app)


def _start_handoff_sweeper(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is not None and any(
        task.lock_options.on_duplicate == "queue" for task in locked_tasks(app)
    ):
        handoff.start_sweeper(app)


def _stop_handoff_sweepers(**_: Any) -> None:
    handoff.stop_sweepers()


def _release_everything_held(**_: Any) -> None:
    for locker in all_lockers():
        try:
            released = locker.release_all()
        except LockError as exc:
            log.error("could not release locks at shutdown: %s", exc)
            continue
        if released:
            log.warning("released %d lock(s) still held at shutdown", released)


signals.task_failure.connect(_reclaim_after_child_death, weak=False)
signals.task_revoked.connect(_reclaim_after_terminate, weak=False)
signals.task_revoked.connect(_forget_discarded_message, weak=False)
signals.worker_init.connect(_prepare_worker_start, weak=False)
signals.worker_ready.connect(_report_lock_server, weak=False)
signals.worker_ready.connect(_start_handoff_sweeper, weak=False)
signals.worker_shutdown.connect(_stop_handoff_sweepers, weak=False)
signals.worker_process_shutdown.connect(_release_everything_held, weak=False)
signals.worker_shutdown.connect(_release_everything_held, weak=False)
