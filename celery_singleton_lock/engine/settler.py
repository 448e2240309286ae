"""One reply settler per process: a lazily started daemon thread that reads the replies of
commands sent without waiting (:meth:`.connections.PinnedConnections.send`), once their
connection has stayed idle for ``interval`` seconds.

Under load the next command on a connection reads the earlier reply itself, and this thread
finds nothing to do. It is woken only when unread replies appear while it sleeps (not once
per command), then looks every ``interval`` until none is left. What it reads is only the
confirmation: Redis ran the command when it arrived.

A forked child starts with an empty settler: its parent's unread replies are the parent's.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from .connections import PinnedConnections

#: Seconds a reply may stay unread on an idle connection before the settler reads it.
SETTLE_INTERVAL = 0.05

_instances: weakref.WeakSet[ReplySettler] = weakref.WeakSet()


class ReplySettler:
    """Reads the replies left unread on idle connections; see the module docstring."""

    def __init__(self, *, interval: float = SETTLE_INTERVAL) -> None:
        self.interval = interval
        self._reset()
        _instances.add(self)

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._watched: weakref.WeakSet[PinnedConnections] = weakref.WeakSet()
        self._wakeup = threading.Condition()
        #: True while the thread is due to look again; read without the lock on the hot path.
        self._scheduled = False
        self._thread: Optional[threading.Thread] = None

    def watch(self, connections: PinnedConnections) -> None:
        """``connections`` has an unread reply (called after it sent one)."""
        if self._scheduled and self._pid == os.getpid():
            return  # the thread will look at every watched set anyway
        with self._wakeup:
            if self._pid != os.getpid():
                self._reset()
            self._watched.add(connections)
            self._scheduled = True
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="celery-singleton-lock-settler", daemon=True
                )
                self._thread.start()
            self._wakeup.notify_all()

    def settle(self) -> bool:
        """Read what is unread on idle connections now; True if some reply is still unread."""
        unread = False
        for connections in list(self._watched):
            unread = connections.settle_idle() or unread
        return unread

    def flush(self, timeout: float = 5.0) -> bool:
        """Read every unread reply; False if some were still unread after ``timeout``."""
        deadline = time.monotonic() + timeout
        while self.settle():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)  # a connection in use: its thread is reading the reply now
        return True

    def _run(self) -> None:
        while True:
            with self._wakeup:
                self._wakeup.wait_for(lambda: self._scheduled or os.getpid() != self._pid)
                if os.getpid() != self._pid:
                    return
            time.sleep(self.interval)  # give the next command on the connection a chance
            if self.settle():
                continue
            self._scheduled = False
            # A reply sent after settle() looked, by a sender that still saw _scheduled set,
            # would otherwise wait for the next send: look once more after clearing the flag.
            if self.settle():
                self._scheduled = True


def _reset_after_fork() -> None:
    for settler in list(_instances):
        settler._reset()


os.register_at_fork(after_in_child=_reset_after_fork)

_process_settler: Optional[ReplySettler] = None
_process_settler_lock = threading.Lock()


def process_settler() -> ReplySettler:
    """The settler shared by every locker of this process (created on first use)."""
    global _process_settler
    if _process_settler is None:
        with _process_settler_lock:
            if _process_settler is None:
                _process_settler = ReplySettler()
    return _process_settler
