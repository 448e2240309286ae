"""Renewal of prefork children's locks from the worker's MAIN process.

A pool child renews its own leases from a thread. A body that holds the GIL in one long C call
(a large sort, ``json.loads`` of a big document, a regex over a large text, a C extension that
keeps the GIL) stops that thread: the lock expires under a running body and a duplicate runs
alongside it. The worker's main process runs no task body, so no child's GIL can stall it.
There, a daemon thread ticks every third of the shortest ``lock_ttl`` of the app's locked
tasks and renews the lock of every locked task running in a child, by owner: the lock value
names ``<pid>|<host>|<task_id>`` (see :mod:`..engine.scripts`), which the main process knows
from Celery's request (``worker_pid``, ``hostname``, ``id``) without the child's token. One
round trip per tick renews the locks of all the children (script ``RENEW_BY_OWNER``).

Bounds:

* only a lock whose value names that very execution is extended: a released or expired lock
  is never created again, a lock held by any other owner is never touched;
* never past the task's hard time limit, counted from when the child accepted the task;
* renewal stops as soon as the request leaves ``celery.worker.state.active_requests`` (the
  child returned, died, or was killed at the hard time limit), or its child is gone.

A child that dies holding a lock (``kill -9``, the OOM killer) is seen gone within
``DEATH_CHECK`` seconds (a signal-0 ``kill`` per running locked request, no round trip): its
lock is no longer renewed, and is freed and handed on at once (:mod:`.reclaim`). Celery reports
the death only once its pool notices it, seconds later at times.

The child's own renewer keeps running: a second source of renewal, and the one that learns
that a lock was lost. Only the prefork pool gets this thread: threads, solo and gevent run
bodies in the process that renews, and a body holding the GIL there stalls renewal with it.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from celery_singleton_lock.celery import celery_api
from celery_singleton_lock.celery.config.limits import limit_for
from celery_singleton_lock.celery.config.lockers import locker_for
from celery_singleton_lock.celery.config.options import UNSET
from celery_singleton_lock.celery.duplicates import latest
from celery_singleton_lock.celery.task.locked_task import LockedTask, lock_owner
from celery_singleton_lock.celery.worker.cancel_grace import CancelGrace, read_safely
from celery_singleton_lock.celery.worker.reclaim import free_dead_holder, pid_is_gone
from celery_singleton_lock.celery.worker.server_probe import unusable_at_start
from celery_singleton_lock.celery.worker.ticking import Ticking
from celery_singleton_lock.engine import LockBackend, Owner
from celery_singleton_lock.errors import LockError

log = logging.getLogger("celery_singleton_lock.renewal")

#: Seconds between two looks at whether the children running locked bodies are still alive.
DEATH_CHECK = 0.2


@dataclass(frozen=True)
class Watched:
    """The lock one running request holds, or will hold once its child takes it."""

    task: LockedTask
    locker: LockBackend
    name: str
    owner: Owner
    ttl: float
    #: wall-clock time past which the task's hard time limit has killed it (None: no limit)
    deadline: Optional[float]
    #: the call's lock_limit: its child holds one of that many slots
    limit: int = 1


class ChildLockSupervisor(Ticking):
    """Renews, from the main process, the locks of locked tasks running in pool children.

    Args:
        requests: returns the requests running in children now (default: Celery's
            ``active_requests`` of this process).
        interval: seconds between renewals.
        clock: wall clock (seconds since the epoch), the clock of ``Request.time_start``.
        gone: tells whether a child's pid is gone; with it, the supervisor looks every
            ``DEATH_CHECK`` seconds and frees a dead child's lock at once (None: requests
            standing for children that are not this worker's, as in the unit tests).
        cancel_grace: terminates the children of restartable calls (``on_duplicate=
            "restart"``) past their grace, looked at every tick (None: not at all).
    """

    def __init__(
        self,
        interval: float,
        *,
        requests: Optional[Callable[[], Iterable[Any]]] = None,
        clock: Callable[[], float] = time.time,
        gone: Optional[Callable[[int], bool]] = None,
        cancel_grace: Optional[CancelGrace] = None,
    ) -> None:
        super().__init__(interval if gone is None else min(interval, DEATH_CHECK))
        self.clock = clock
        self._gone = gone
        #: a renewal every this many ticks (the ticks between only look for dead children)
        self._renew_every = max(1, round(interval / self.interval))
        self._requests = requests or celery_api.running_requests
        self._cancel_grace = cancel_grace
        #: by (task id, child pid); None when the request's task takes no lock we can name
        self._watched: dict[tuple[str, int], Optional[Watched]] = {}
        #: round trips sent (one per lock server per tick), for tests
        self.round_trips = 0

    thread_name = "celery-singleton-lock-supervisor"
    job = "renewal of the pool children's locks"

    def tick(self) -> int:
        """Free the lock of every locked request whose child is gone; on a renewal tick,
        renew the others' locks. How many were still held by their request (and renewed)."""
        self.ticks += 1
        renewing = (self.ticks - 1) % self._renew_every == 0
        now = self.clock()
        dead: list[Watched] = []
        batches: dict[LockBackend, list[tuple[str, Owner, float]]] = defaultdict(list)
        limits: dict[LockBackend, list[int]] = defaultdict(list)
        seen: dict[tuple[str, int], Optional[Watched]] = {}
        restartable: list[tuple[Any, Watched]] = []
        for request in self._requests():
            pid, task_id = celery_api.child_pid(request), getattr(request, "id", None)
            if not pid or not task_id:
                continue  # not accepted by a child yet
            ident = (task_id, pid)
            watched = seen[ident] = (
                self._watched[ident] if ident in self._watched else _watch(request, pid)
            )
            if watched is None:
                continue
            if self._gone is not None and self._gone(pid):
                dead.append(watched)
                seen[ident] = None  # freed once; forgotten when Celery drops the request
                continue
            if watched.task.lock_options.policy.restarts:
                restartable.append((request, watched))
            if not renewing:
                continue
            ttl = (
                watched.ttl
                if watched.deadline is None
                else min(watched.ttl, watched.deadline - now)
            )
            if ttl > 0:
                batches[watched.locker].append((watched.name, watched.owner, ttl))
                limits[watched.locker].append(watched.limit)
        self._watched = seen  # requests that left active_requests are forgotten here
        if self._cancel_grace is not None and restartable:
            read_safely(self._cancel_grace, restartable)
        renewed = 0
        for locker, batch in batches.items():
            self.round_trips += 1
            try:
                lost = locker.renew_by_owner(batch, limits=limits[locker])
                renewed += len(batch) - len(lost)
            except LockError as exc:
                log.warning("could not renew the pool children's locks: %s", exc)
        for watched in dead:  # Celery's own report of the death comes later, or never
            owner = watched.owner
            free_dead_holder(
                watched.task,
                watched.locker,
                watched.name,
                watched.limit,
                owner.task_id,
                owner.host,
                wait=0.0,
            )
        return renewed


def _watch(request: Any, pid: int) -> Optional[Watched]:
    """What renewing ``request``'s lock needs (computed once: the name is fixed by the
    arguments), or None for a task that is not a ``LockedTask``."""
    task = getattr(request, "task", None)
    if not isinstance(task, LockedTask):
        return None
    options = task.lock_options
    try:
        name = options.keyer.name(request.args, request.kwargs)
        limit = limit_for(task.name, options.limit, options.keyer, request.args, request.kwargs)
    except LockError as exc:  # the child fails the same way in before_start, holding nothing
        log.debug("task %s[%s]: no lock name (%s)", task.name, request.id, exc)
        return None
    hard = celery_api.accepted_hard_time_limit(request) or options.default_time_limit
    started = celery_api.accepted_at(request)
    return Watched(
        task=task,
        locker=locker_for(task.app),
        name=name,
        owner=lock_owner(request.id, request, pid),
        ttl=options.ttl,
        deadline=float(started) + float(hard) if hard and started else None,
        limit=limit,
    )


_supervisor: Optional[ChildLockSupervisor] = None


def start_child_renewal(sender: Any = None, **_: Any) -> None:
    global _supervisor
    app = getattr(sender, "app", None)
    if app is None or _supervisor is not None:
        return
    if not celery_api.runs_bodies_in_children(sender):
        _say_restart_is_cooperative(app)
        return
    ttls = [
        task.lock_options.ttl
        for task in app.tasks.values()
        if isinstance(task, LockedTask) and task.name
    ]
    if ttls:
        # Created here, in the thread that forks replacement children, never in the
        # supervisor thread: a fork while that thread held the lockers' lock would leave the
        # child unable to create its own locker.
        # Not for a server the start check found unusable (and named): asking it again here
        # would hold "ready" for as long as its timeouts and retries last.
        if not unusable_at_start:
            try:
                locker_for(app)
            except LockError as exc:  # made on the supervisor's first tick that reaches it
                log.debug("lock server not reachable at worker start: %s", exc)
        pool = sender.pool
        _supervisor = ChildLockSupervisor(
            min(ttls) / 3,
            gone=pid_is_gone,
            cancel_grace=CancelGrace(
                lambda request: celery_api.terminate(request, pool, latest.SUPERSEDED)
            ),
        )
        _supervisor.start()
        log.info(
            "renewing the locks of pool children from the main process every %.2fs, and "
            "freeing a dead child's lock within %.2fs",
            min(ttls) / 3,
            _supervisor.interval,
        )


def _say_restart_is_cooperative(app: Any) -> None:
    """A pool without children (threads, gevent, solo): a restart only asks the running call
    to stop; say it once per restartable task whose lock_cancel_grace was set."""
    for task in app.tasks.values():
        if (
            isinstance(task, LockedTask)
            and task.name
            and task.lock_options.policy.restarts
            and type(task).lock_cancel_grace is not UNSET
        ):
            log.warning(
                "task %s: lock_cancel_grace has no effect in this pool (no pool child to "
                "terminate): a newer call only asks the running one to stop "
                "(self.request.lock.cancelled)",
                task.name,
            )


def stop_child_renewal(**_: Any) -> None:
    global _supervisor
    if _supervisor is not None:
        _supervisor.stop()
        _supervisor = None
