"""Fork safety, in one place.

A forked child (a prefork pool child) starts with a copy of its parent's memory: the parent's
leases, its renewer's registry and thread state, its kept connections. None of it is the
child's. The child must never renew or release its parent's locks, and never read replies on
its parent's sockets. Every object that holds such per-process state registers here, and is
reset in the child right after the fork, before the child runs any code of its own.
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


def _after_fork_in_child() -> None:
    for obj in list(_registered):
        obj.after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


class ForkSafeLock:
    """A ``threading.Lock`` that a forked child gets anew: a lock some other thread of the
    parent held at the fork would otherwise stay held in the child forever."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        reset_in_forked_children(self)

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> ForkSafeLock:
        self._lock.acquire()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._lock.release()
