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
  ``worker_ready``: log the lock server and warn if it may evict locks (see :mod:`.start_checks`).
* ``worker_ready`` with tasks of policy ``queue``: start the hand-off sweeper in the main
  process (see :mod:`.handoff_sweeper`); ``worker_shutdown`` stops it.
* ``worker_process_shutdown`` (a prefork child on its way out, its body done): release
  whatever this process holds. In the worker's main process (the bodies of a ``threads``,
  ``solo`` or ``gevent`` pool run there) the same release runs at interpreter exit, after
  Python has waited for the pool's threads: not at ``worker_shutdown``, which a cold shutdown
  of a threads pool sends while bodies still run (Celery cannot cancel a thread: its
  ``terminate_job`` raises ``NotImplementedError``, and the worker then waits for them or
  leaves them behind as it exits), so their locks stay held as long as they run.
* ``worker_init`` (main process, before the pool forks): turn on the metrics
  (``singleton_lock_metrics``) and the trace events (opentelemetry installed) by connecting
  their receivers, so nothing runs for them when they are off; ``worker_ready`` serves
  ``/metrics`` (``singleton_lock_metrics_port``), ``worker_shutdown`` stops it;
  ``worker_process_shutdown`` merges an exiting child's metrics files into the archive.
* ``worker_init`` reads whether the worker sends task events, ``worker_ready`` follows that
  setting from the main process (see :mod:`.task_events`): our events are sent only then.

Every ``celery`` process imports this module (the ``celery locks`` command is a
``celery.commands`` entry point), so these receivers are connected for every app, ours or not.
Each one is a no-op for an app with no ``LockedTask``: no bootstep, no check, no thread, no
log line, no connection. No opt-in setting is needed: a worker runs only the tasks registered
by the time it starts (Celery imports the ``-A`` module, ``imports``/``include`` and the
autodiscovered modules, then finalizes the app, before ``worker_init``), so the registry says
whether it will take locks.
"""

from __future__ import annotations

import atexit
import logging
from typing import Any, Optional

from celery import signals
from celery.exceptions import TimeLimitExceeded, WorkerLostError

from celery_singleton_lock.celery.config.lockers import all_lockers
from celery_singleton_lock.celery.duplicates import enqueue
from celery_singleton_lock.celery.observe import metrics, tracing
from celery_singleton_lock.celery.task.locked_task import LockedTask
from celery_singleton_lock.celery.worker.child_renewal import (
    start_child_renewal,
    stop_child_renewal,
)
from celery_singleton_lock.celery.worker.handoff_sweeper import start_sweeper, stop_sweepers
from celery_singleton_lock.celery.worker.reclaim import (
    drop_discarded_parked_call,
    reclaim_in_background,
)
from celery_singleton_lock.celery.worker.start_checks import (
    install_configuration_check,
    locked_tasks,
    report_lock_server,
)
from celery_singleton_lock.celery.worker.task_events import (
    follow,
    start_following,
    stop_following,
)
from celery_singleton_lock.errors import LockError

log = logging.getLogger("celery_singleton_lock.worker")

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
        reclaim_in_background(sender, task_id, args, kwargs, node or _node_name)


def _reclaim_after_terminate(
    sender: Any = None, request: Any = None, terminated: bool = False, **_: Any
) -> None:
    if terminated and isinstance(sender, LockedTask) and request is not None:
        node = getattr(request, "hostname", None) or _node_name
        reclaim_in_background(sender, request.id, request.args, request.kwargs, node)


def _forget_discarded_message(
    sender: Any = None, request: Any = None, terminated: bool = False, **_: Any
) -> None:
    # Also after a terminate: a compare-and-delete by task id, so at worst it finds nothing.
    if not isinstance(sender, LockedTask) or not getattr(request, "id", None):
        return
    options = sender.lock_options
    if options.dedupe_on_enqueue:
        enqueue.forget_discarded(sender, request)
    if options.policy.parks and not terminated:
        # a parked call handed the lock but discarded (revoked, expired) never takes it:
        # hand it on now, not when the reservation runs out (and is made for it again)
        drop_discarded_parked_call(sender, request)


def _prepare_worker_start(sender: Any = None, **_: Any) -> None:
    # worker_init: too early to stop the worker or to log (see .startup); it only adds the
    # bootstep that checks the configuration once logging is set up.
    global _node_name
    app = getattr(sender, "app", None)
    if app is None:
        return
    # Finalized (``celery worker`` finalizes the app before worker_init): its tasks are known,
    # and an app with no locked task is left alone. Not yet finalized (a WorkController
    # built in code): finalizing here would swallow a task's configuration error (Celery
    # logs what a receiver raises), so the bootstep decides, where errors stop the worker.
    if app.finalized and not locked_tasks(app):
        return
    _node_name = getattr(sender, "hostname", None) or _node_name
    install_configuration_check(app)
    # once per process: releases what a body left behind as the worker's main process exits
    atexit.unregister(_release_everything_held)
    atexit.register(_release_everything_held)


def _observe(sender: Any = None, **_: Any) -> None:
    # worker_init: before the pool forks, so pool children inherit the receivers and the
    # metrics directory (see observe/metrics.py)
    app = getattr(sender, "app", None)
    if app is None or (app.finalized and not locked_tasks(app)):  # as _prepare_worker_start
        return
    metrics.set_up(app, getattr(sender, "hostname", None))
    tracing.connect(app.conf)
    start_following(sender)  # our events go where the worker's task events go


def _follow_task_events(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is not None and locked_tasks(app):
        follow(sender)


def _stop_following_task_events(**_: Any) -> None:
    stop_following()


def _serve_metrics(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is not None:
        metrics.serve(app)


def _stop_metrics(**_: Any) -> None:
    metrics.stop_serving()


def _report_lock_server(sender: Any = None, **_: Any) -> None:
    # worker_ready, not worker_init: Celery sets up its logging in between.
    app = getattr(sender, "app", None)
    if app is not None:
        report_lock_server(app)


def _start_handoff_sweeper(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is not None and any(task.lock_options.policy.parks for task in locked_tasks(app)):
        start_sweeper(app)


def _stop_handoff_sweepers(**_: Any) -> None:
    stop_sweepers()


def _release_everything_held(**_: Any) -> None:
    for locker in all_lockers():
        try:
            released = locker.release_all()
        except LockError as exc:
            log.error("could not release locks at shutdown: %s", exc)
            continue
        if released:
            log.warning("released %d lock(s) still held at shutdown", released)


# worker_ready and worker_shutdown are sent in the worker's main process only.
signals.worker_ready.connect(start_child_renewal, weak=False)
signals.worker_shutdown.connect(stop_child_renewal, weak=False)
signals.task_failure.connect(_reclaim_after_child_death, weak=False)
signals.task_revoked.connect(_reclaim_after_terminate, weak=False)
signals.task_revoked.connect(_forget_discarded_message, weak=False)
signals.worker_init.connect(_prepare_worker_start, weak=False)
signals.worker_ready.connect(_report_lock_server, weak=False)
signals.worker_ready.connect(_start_handoff_sweeper, weak=False)
signals.worker_shutdown.connect(_stop_handoff_sweepers, weak=False)
signals.worker_process_shutdown.connect(_release_everything_held, weak=False)
# after the release (its reply times the held histogram): the child's last counts
signals.worker_process_shutdown.connect(metrics.retire_process, weak=False)
signals.worker_init.connect(_observe, weak=False)
signals.worker_ready.connect(_serve_metrics, weak=False)
signals.worker_ready.connect(_follow_task_events, weak=False)
signals.worker_shutdown.connect(_stop_following_task_events, weak=False)
signals.worker_shutdown.connect(_stop_metrics, weak=False)
