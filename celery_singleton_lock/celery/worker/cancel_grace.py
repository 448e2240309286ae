"""The grace of a call asked to stop (policy ``restart``), kept by a prefork worker's MAIN
process: a body that has not ended ``lock_cancel_grace`` seconds after a newer call asked it
to stop has its pool child terminated, as ``revoke(terminate=True)`` does, and ends REVOKED
("superseded").

The children's supervisor (:mod:`.child_renewal`) hands this its running restartable calls on
every tick (every ``DEATH_CHECK`` seconds); their cancel flags are read in one round trip per
lock server. The grace counts from when this process first saw the flag. Once the child is
gone, the supervisor's next tick (and Celery's ``task_revoked``) frees the lock by owner, and
the policy hands it to the waiting call at once. Threads, gevent and solo pools have no child
to terminate: there the body is only asked (see :mod:`..duplicates.restart`).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any, Callable

from celery_singleton_lock.celery import celery_api
from celery_singleton_lock.celery.duplicates import latest
from celery_singleton_lock.engine import LockBackend
from celery_singleton_lock.errors import LockError

log = logging.getLogger("celery_singleton_lock.worker")

#: What terminates a worker request's pool child (``celery_api.terminate`` with the pool).
Terminate = Callable[[Any], None]


class CancelGrace:
    """Terminates the pool children of restartable calls past their grace.

    Args:
        terminate: ends a worker request's pool child.
        clock: monotonic seconds.
    """

    def __init__(self, terminate: Terminate, clock: Callable[[], float] = time.monotonic) -> None:
        self._terminate = terminate
        self._clock = clock
        #: task id -> when this process first saw it asked to stop
        self._asked_at: dict[str, float] = {}
        #: task ids terminated (once each)
        self.terminated: set[str] = set()

    def look(self, running: list[tuple[Any, Any]]) -> int:
        """``running``: ``(worker request, Watched)`` of the restartable calls running in
        children now. Terminate those past their grace; returns how many were.

        Raises:
            LockError: a lock server could not be read (the supervisor logs it and looks
                again at its next tick).
        """
        by_locker: dict[LockBackend, list[tuple[Any, Any]]] = defaultdict(list)
        for request, watched in running:
            if request.id not in self.terminated:
                by_locker[watched.locker].append((request, watched))
        now = self._clock()
        asked_now: dict[str, float] = {}
        ended = 0
        for locker, calls in by_locker.items():
            cancels = locker.cancels
            if cancels is None:  # no latest wins on this backend: registration refused restart
                continue
            flags = cancels.cancel_requested([(w.name, request.id) for request, w in calls])
            for (request, watched), asked in zip(calls, flags):
                if not asked:
                    continue
                first = asked_now[request.id] = self._asked_at.get(request.id, now)
                if now - first >= watched.task.lock_options.cancel_grace:
                    self._end(request, watched)
                    ended += 1
        self._asked_at = asked_now  # calls that ended (or were ended) are forgotten here
        self.terminated &= {request.id for request, _ in running}
        return ended

    def _end(self, request: Any, watched: Any) -> None:
        task = watched.task
        key = watched.locker.keys(watched.name).lock
        holder = watched.locker.inspect.read(watched.name)
        if holder is None or holder.task_id != request.id:
            return  # its body ended meanwhile (released): its child may run another call now
        log.warning(
            "task %s[%s]: still running %.1fs after a newer call asked it to stop "
            "(lock_cancel_grace); terminating its pool child %s",
            task.name,
            request.id,
            task.lock_options.cancel_grace,
            watched.owner.pid,
        )
        self.terminated.add(request.id)
        try:
            self._terminate(request)
        except Exception:  # Celery's pool: whatever it raises, the next call's wait goes on
            log.exception("task %s[%s]: could not terminate its pool child", task.name, request.id)
            return
        context = celery_api.request_context(request)
        latest.mark_superseded(task, context, "a newer call", key, request.hostname or "")


def read_safely(grace: CancelGrace, running: list[tuple[Any, Any]]) -> int:
    """:meth:`CancelGrace.look`, a lock server's error logged (looked at again next tick)."""
    try:
        return grace.look(running)
    except LockError as exc:
        log.warning("could not read the cancel flags of running calls: %s", exc)
        return 0
