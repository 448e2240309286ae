"""Cancel flags pushed to the process that runs the call (policy ``restart``).

A newer call asks the running holder of its lock to stop (lua/cancel_holder.lua): it writes the
flag beside the lock and publishes the holder's task id on the lock's cancel channel. A process
running restartable calls keeps ONE pub/sub connection per lock server for them
(:class:`CancelWatch`) and one daemon thread reading it: a call whose body looks at its lock's
``cancelled`` is watched (its channel subscribed) until its lock is released, and the thread
sets its :class:`CancelSignal` within a round trip of the newer call's script, so the body's
next look sees it without asking the server.

A message can be missed: published before the subscription took effect, or while the
connection was down. So every subscription confirmed (the first, and each one made again after
a reconnect) is followed by one read of the flags of the calls watched on that channel, and
the body itself still reads the flag now and then (``CANCEL_POLL`` of the task's lock scope):
polling is the fallback, not the way the news comes.

On a Redis Cluster the channel is a shard channel (``SSUBSCRIBE``, Redis >= 7): the message
stays within the shard of the lock's slot instead of going to every node; redis-py's cluster
pub/sub keeps one connection per primary that has a watched lock.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional, Sequence

from redis.exceptions import RedisError

from celery_singleton_lock.engine import fork_safety
from celery_singleton_lock.errors import LockError

log = logging.getLogger("celery_singleton_lock.cancel")

#: Reads the cancel flags of ``(lock name, task id)`` pairs (kinds/cancels.py).
ReadFlags = Callable[[Sequence[tuple[str, str]]], list[bool]]

#: Seconds the thread waits for a message at a time (it notices new channels between waits
#: only on a Cluster, whose pub/sub is one connection per node).
LISTEN_TIMEOUT = 0.5
#: Seconds between two attempts to listen again after the connection failed.
RECONNECT_PAUSE = 0.5


class CancelSignal:
    """One watched call: ``asked`` turns True once a newer call asked it to stop."""

    __slots__ = ("asked", "channel", "name", "subscribed", "task_id")

    def __init__(self, name: str, channel: str, task_id: str) -> None:
        self.name = name
        self.channel = channel
        self.task_id = task_id
        #: set by the watch's thread (a plain attribute: reading it costs the body nothing)
        self.asked = False
        #: set once the server confirmed the channel's subscription: the news is pushed from
        #: then on (never, where the client cannot subscribe, e.g. SSUBSCRIBE before redis-py
        #: 5: the body then keeps reading the flag itself)
        self.subscribed = False


class CancelWatch:
    """The cancel channels of one lock server that this process listens to (see the module
    docstring).

    Args:
        client: the locker's redis-py client (a ``RedisCluster`` for a cluster).
        read_flags: reads the flags of watched calls (after a subscription is confirmed).
        sharded: subscribe with ``SSUBSCRIBE`` (a Redis Cluster), else ``SUBSCRIBE``.
    """

    def __init__(self, client: Any, read_flags: ReadFlags, *, sharded: bool) -> None:
        self._client = client
        self._read_flags = read_flags
        self._sharded = sharded
        self._reset()
        fork_safety.reset_in_forked_children(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._by_channel: dict[str, list[CancelSignal]] = {}
        self._pubsub: Any = None
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        #: subscriptions confirmed, messages that set a signal, and flags found set by the
        #: read after a confirmation instead (tests, bench)
        self.confirmed = 0
        self.pushed = 0
        self.read = 0

    def after_fork_in_child(self) -> None:
        # the parent's connection and thread are not the child's (the connection is never
        # closed from here: redis-py only shuts a socket down in the process that opened it)
        self._reset()

    # -- the calls' side ------------------------------------------------------------------------

    def watch(self, name: str, channel: str, task_id: str) -> CancelSignal:
        """Listen for the stop of the call ``task_id`` holding the lock ``name`` (its cancel
        ``channel``) until :meth:`unwatch`. The subscription is sent, not waited for: its
        confirmation (read by the thread) is followed by a read of the flag."""
        signal = CancelSignal(name, channel, task_id)
        with self._lock:
            if self._closed:
                return signal  # never told: the bodies' own reads still see the flag
            signals = self._by_channel.setdefault(channel, [])
            signals.append(signal)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._listen, name="celery-singleton-lock-cancels", daemon=True
                )
                self._thread.start()
            if len(signals) == 1 and self._pubsub is not None:
                try:
                    self._subscribe(self._pubsub, [channel])
                except (RedisError, OSError, ValueError, AttributeError):
                    # the connection is down: the thread finds it so too, and subscribes
                    # every watched channel again on a new one (this one included)
                    pass
            self._wake.notify()
        return signal

    def unwatch(self, signal: CancelSignal) -> None:
        """Stop listening for ``signal``'s call (its lock is released)."""
        with self._lock:
            signals = self._by_channel.get(signal.channel)
            if signals is None or signal not in signals:
                return
            signals.remove(signal)
            if signals:
                return
            del self._by_channel[signal.channel]
            if self._pubsub is not None:
                try:
                    if self._sharded:
                        self._pubsub.sunsubscribe(signal.channel)
                    else:
                        self._pubsub.unsubscribe(signal.channel)
                except (RedisError, OSError, ValueError, AttributeError):
                    pass  # the thread makes a new connection, without this channel

    def close(self) -> None:
        """Stop listening (the locker is closed): the thread closes its connection and ends
        within :data:`LISTEN_TIMEOUT` (closed from here, it would be closed under the
        thread's read)."""
        with self._lock:
            self._closed = True
            self._by_channel.clear()
            self._wake.notify()

    def watched(self) -> int:
        """How many channels are listened to now."""
        with self._lock:
            return len(self._by_channel)

    # -- the thread -----------------------------------------------------------------------------

    def _subscribe(self, pubsub: Any, channels: list[str]) -> None:
        if self._sharded:
            pubsub.ssubscribe(*channels)
        else:
            pubsub.subscribe(*channels)

    def _connect(self) -> Any:
        """A new pub/sub connection subscribed to every channel watched now (None when none
        is; the caller holds the lock)."""
        pubsub = self._client.pubsub()
        channels = list(self._by_channel)
        if channels:
            self._subscribe(pubsub, channels)
        return pubsub

    def _listen(self) -> None:
        while True:  # a daemon thread: it ends with its process, or when closed
            with self._lock:
                while not self._by_channel and not self._closed:
                    self._wake.wait()
                if self._closed:
                    _close(self._pubsub)
                    self._pubsub = None
                    return
                pubsub = self._pubsub
                if pubsub is None:
                    try:
                        pubsub = self._pubsub = self._connect()
                    except RedisError as exc:
                        log.debug("cannot subscribe to cancel channels yet: %s", exc)
                        pubsub = None
            if pubsub is None:
                time.sleep(RECONNECT_PAUSE)
                continue
            try:
                if self._sharded:
                    message = pubsub.get_sharded_message(timeout=LISTEN_TIMEOUT)
                else:
                    message = pubsub.get_message(timeout=LISTEN_TIMEOUT)
            except (RedisError, OSError, ValueError, AttributeError) as exc:
                # (a pub/sub closed under the call says AttributeError) messages sent
                # meanwhile are lost: the new connection's confirmations read
                # the flags again
                log.debug("cancel channels' connection lost (%s); subscribing again", exc)
                with self._lock:
                    if self._pubsub is pubsub:
                        self._pubsub = None
                _close(pubsub)
                time.sleep(RECONNECT_PAUSE)
                continue
            if message is not None:
                self._take(message)

    def _take(self, message: dict[str, Any]) -> None:
        kind = _text(message.get("type"))
        channel = _text(message.get("channel"))
        if kind in ("subscribe", "ssubscribe"):
            self.confirmed += 1
        with self._lock:
            watched = list(self._by_channel.get(channel, ()))
        if kind in ("subscribe", "ssubscribe"):
            for signal in watched:
                signal.subscribed = True
        signals = [s for s in watched if not s.asked]
        if not signals:
            return
        if kind in ("message", "smessage"):
            task_id = _text(message.get("data"))
            for signal in signals:
                if signal.task_id == task_id:
                    signal.asked = True
                    self.pushed += 1
        elif kind in ("subscribe", "ssubscribe"):
            # a message published before this confirmation was not heard: read the flags
            try:
                flags = self._read_flags([(s.name, s.task_id) for s in signals])
            except (LockError, RedisError, OSError, ValueError) as exc:
                # the bodies' own reads are the fallback (a client closed under it says
                # OSError or ValueError)
                log.debug("cannot read cancel flags after subscribing: %s", exc)
                return
            for signal, asked in zip(signals, flags):
                if asked:
                    signal.asked = True
                    self.read += 1


def _close(pubsub: Any) -> None:
    if pubsub is not None:
        try:
            pubsub.close()
        except (RedisError, OSError, AttributeError):  # half closed already
            pass


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)
