"""Fork safety, in one place.

A forked child (a prefork pool child) starts with a copy of its parent's memory: the parent's
leases, its renewer's registry and thread state, its kept connections. None of it is the
child's. The child must never renew or release its parent's locks, and never read replies on
its parent's sockets. Every object that holds such per-process state registers here, and is
reset in the child right after the fork, before the child runs any code of its own.

A lock that belongs to a library, not to us, cannot be reset that way: a section of code that
takes such locks on a thread other than the one that forks runs under :data:`no_fork`, so
that the fork waits for it to end instead of copying its locks held.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Protocol


class ForkAware(Protocol):
    def after_fork_in_child(self) -> None:
        """Forget what belongs to the parent process."""


_registered: weakref.WeakSet[ForkAware] = weakref.WeakSet()


def reset_in_forked_children(obj: ForkAware) -> None:
    """Call ``obj.after_fork_in_child()`` in every child this process forks from now on."""
    _registered.add(obj)


#: This process's id, as ``os.getpid()`` (a system call on every call, several per task on
#: the hot path) answers it: kept here, and set again in every forked child first thing. The
#: engine's hot path reads it as ``fork_safety.pid`` (no call); others call current_pid().
pid = os.getpid()


def current_pid() -> int:
    """This process's id (see :data:`pid`)."""
    return pid


def _after_fork_in_child() -> None:
    global pid
    pid = os.getpid()
    for obj in list(_registered):
        obj.after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


class ForkSafeLock:
    """A ``threading.Lock`` that a forked child gets anew: a lock some other thread of the
    parent held at the fork would otherwise stay held in the child forever."""

    def __init__(self) -> None:
        #: the lock itself (a new one in a forked child): ``with fork_safe.lock:`` on a hot
        #: path saves the two Python calls of this wrapper's ``__enter__`` and ``__exit__``
        self.lock = threading.Lock()
        reset_in_forked_children(self)

    def after_fork_in_child(self) -> None:
        self.lock = threading.Lock()

    def __enter__(self) -> ForkSafeLock:
        self.lock.acquire()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.lock.release()


class NoForkWhile:
    """Sections of code during which this process does not fork: ``os.fork()`` waits until
    the section running ends (``with no_fork: ...``), and sections wait while a fork runs.

    For a section that takes locks which a child will need and no fork handler resets, run on
    a thread other than the one that forks. A thread holding such a lock does not exist in the
    child, so nothing ever releases the copy there: the child blocks for ever at its next use.
    The case it is made for: the worker's main process sends messages (kombu, Celery) from
    background threads while its main thread forks pool children, and every kombu or Celery
    ``cached_property`` takes a lock, one per property shared by all instances, at each access,
    dozens per message sent (issue 19: a replacement pool child hung in ``Celery.amqp``
    handing on its lock after its body). Waiting is the cheap side: a fork waits at most for
    one section; a child forked in the middle of one would hang for good.

    Nothing under it may fork, nor wait for the thread that forks.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # ``before`` runs in the forking thread before the interpreter takes its own locks
        # (import, and logging's, registered earlier, runs after this one), so a section
        # may import and log.
        os.register_at_fork(
            before=self.__enter__,
            after_in_parent=self._release,
            after_in_child=self._after_fork_in_child,
        )

    def _after_fork_in_child(self) -> None:
        # the forking thread took it; in the child no section runs
        self._lock = threading.Lock()

    def _release(self) -> None:
        self._lock.release()

    def __enter__(self) -> NoForkWhile:
        self._lock.acquire()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._lock.release()


#: The one section guard of this process (one lock: a fork waits for one section at most).
no_fork = NoForkWhile()
