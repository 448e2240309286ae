"""Connections a locker keeps checked out of its client's pool, for its hot-path scripts.

Why not ``client.execute_command``: redis-py checks a connection out of the pool for every
command and, at each checkout, polls the socket to make sure no stale reply is waiting on it.
That costs a system call and, with the pool's bookkeeping, about 60 us of a 150 us round trip
on a small machine: more than the lock's own work. A locker instead keeps the connections its
threads use checked out (one per thread at a time, taken back after each command) and keeps
them clean itself: any exception in the middle of a command (a timeout, a soft time limit, an
interrupt) disconnects the connection, so a stale reply can never be read as the answer to a
later command. Connections, their protocol, TLS, authentication, health checks and retry
policy are still redis-py's own.

A command can also be sent without waiting for its reply (:meth:`PinnedConnections.send`).
Redis runs it as soon as it arrives; the reply is read before the next command on that
connection, or by the process :class:`~.settler.ReplySettler` once the connection has stayed
idle for a moment. A task's release goes this way: the lock is free at once, and the task does
not wait a round trip for the confirmation.

With a ``BlockingConnectionPool`` (a hard cap on connections) nothing is kept checked out: each
command takes a connection from the pool and gives it back, so the locker never starves the
renewer or the application of one.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Optional

import redis
from redis.exceptions import ResponseError

if TYPE_CHECKING:
    from .settler import ReplySettler

log = logging.getLogger("celery_singleton_lock.release")

#: Called with the reply of a command sent by :meth:`PinnedConnections.send`, or with the
#: exception instance when it failed (an error reply, or the connection broke before the reply
#: was read: then whether Redis ran the command is unknown).
ReplyHandler = Callable[[Any], None]


class _Pinned:
    """One connection checked out of the pool, and the handler of its unread reply, if any."""

    __slots__ = ("connection", "pending")

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.pending: Optional[ReplyHandler] = None


def _connection_getter(pool: Any) -> Callable[[], Any]:
    """``pool.get_connection`` as a call without arguments, on every redis-py version.

    redis-py before 5.3 requires a command name (which its pools ignore); 5.3 made it optional
    and deprecated passing it. Decided once per pool from the signature, not at each checkout.
    """
    get_connection = pool.get_connection
    try:
        parameter = inspect.signature(get_connection).parameters.get("command_name")
    except (TypeError, ValueError):  # no signature to read: assume the current form
        parameter = None
    if parameter is None or parameter.default is not inspect.Parameter.empty:
        return get_connection  # type: ignore[no-any-return]
    # The command these connections mostly carry; redis-py's own pools do not look at it.
    return functools.partial(get_connection, "EVALSHA")


def _deliver(handler: ReplyHandler, reply: Any) -> None:
    try:
        handler(reply)
    except Exception:  # a handler's bug must not break the connection or the caller
        log.exception("reply handler %r raised", handler)


class PinnedConnections:
    """The connections one locker keeps checked out of ``client``'s pool; see the module doc.

    Thread-safe: a connection is used by one thread at a time (taken from an idle list and put
    back after each command). Fork-safe: a forked child never touches its parent's connections
    (redis-py's pool hands it fresh ones).
    """

    def __init__(self, client: redis.Redis, *, settler: Optional[ReplySettler] = None) -> None:
        self._pool = client.connection_pool
        self._get_connection = _connection_getter(self._pool)
        self._settler = settler
        #: False for a BlockingConnectionPool: connections go back to the pool after each use.
        self.keeps_connections = not isinstance(self._pool, redis.BlockingConnectionPool)
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._idle: deque[_Pinned] = deque()
        self._all: list[_Pinned] = []
        self._all_lock = threading.Lock()

    # -- checkout -----------------------------------------------------------------------------

    def _checkout(self) -> _Pinned:
        if self._pid != os.getpid():
            self._reset()  # the parent's connections are the parent's
        try:
            return self._idle.pop()  # the most recently used: its socket is warm
        except IndexError:
            pinned = _Pinned(self._get_connection())
            with self._all_lock:
                self._all.append(pinned)
            return pinned

    def _checkin(self, pinned: _Pinned) -> None:
        if self.keeps_connections or pinned.pending is not None:
            self._idle.append(pinned)
            return
        with self._all_lock:
            self._all.remove(pinned)
        self._pool.release(pinned.connection)

    def _broken(self, pinned: _Pinned, error: BaseException) -> None:
        """Drop the connection's socket (its state is unknown) and fail its unread reply."""
        pinned.connection.disconnect()
        handler, pinned.pending = pinned.pending, None
        if handler is not None:
            _deliver(handler, error)

    def _settle(self, pinned: _Pinned) -> None:
        """Read the reply left unread on ``pinned`` and hand it to its handler."""
        handler = pinned.pending
        if handler is None:
            return
        try:
            reply = pinned.connection.read_response()
        except ResponseError as exc:  # an error reply: the connection itself is fine
            reply = exc
        pinned.pending = None
        _deliver(handler, reply)

    # -- commands -----------------------------------------------------------------------------

    def call(self, *command: Any) -> Any:
        """Send ``command`` and return its reply, as ``client.execute_command`` would.

        Connection errors are retried by the connection's own retry policy. An error reply
        raises redis-py's exception for it (e.g. ``NoScriptError``).
        """
        pinned = self._checkout()
        try:
            return pinned.connection.retry.call_with_retry(
                lambda: self._round_trip(pinned, command),
                lambda error: self._broken(pinned, error),
            )
        except ResponseError:
            raise  # the reply was read: the connection is clean
        except BaseException as exc:
            self._broken(pinned, exc)
            raise
        finally:
            self._checkin(pinned)

    def _round_trip(self, pinned: _Pinned, command: tuple[Any, ...]) -> Any:
        # An earlier reply is read first: it arrived long ago, and a health-check PING
        # inside send_command must not read it as its PONG.
        self._settle(pinned)
        pinned.connection.send_command(*command)
        return pinned.connection.read_response()

    def send(self, *command: Any, on_reply: ReplyHandler) -> None:
        """Send ``command`` now; ``on_reply`` gets its reply later, from whichever thread
        reads it (the next command on that connection, or the settler thread).

        Raises:
            redis.exceptions.ConnectionError, TimeoutError: the command could not be sent
                (nothing was retried: the caller may fall back to :meth:`call`).
        """
        if not self.keeps_connections:
            try:
                reply: Any = self.call(*command)
            except ResponseError as exc:
                reply = exc
            _deliver(on_reply, reply)
            return
        pinned = self._checkout()
        try:
            self._settle(pinned)
            pinned.connection.send_command(*command)
            pinned.pending = on_reply
        except ResponseError:
            raise
        except BaseException as exc:
            self._broken(pinned, exc)
            raise
        finally:
            self._checkin(pinned)
        if self._settler is not None:
            self._settler.watch(self)

    # -- settling -----------------------------------------------------------------------------

    def has_pending(self) -> bool:
        """A reply sent with :meth:`send` is still unread on some connection."""
        if self._pid != os.getpid():
            return False
        return any(pinned.pending is not None for pinned in list(self._all))

    def settle_idle(self) -> bool:
        """Read the unread replies of the idle connections; True if some remain unread
        (on connections other threads are using now: they read them themselves)."""
        if self._pid != os.getpid():
            return False
        for _ in range(len(self._idle)):
            try:
                pinned = self._idle.popleft()
            except IndexError:
                break
            try:
                self._settle(pinned)
            except (redis.exceptions.RedisError, OSError) as exc:
                self._broken(pinned, exc)
            finally:
                self._checkin(pinned)
        return self.has_pending()

    def close(self) -> None:
        """Read what is unread, then give every idle connection back to the pool."""
        self.settle_idle()
        while True:
            try:
                pinned = self._idle.pop()
            except IndexError:
                return
            with self._all_lock:
                self._all.remove(pinned)
            if pinned.pending is None:
                self._pool.release(pinned.connection)
            else:
                self._broken(pinned, redis.exceptions.ConnectionError("locker closed"))

    def __len__(self) -> int:
        """Connections checked out now (idle or in use)."""
        return len(self._all) if self._pid == os.getpid() else 0
