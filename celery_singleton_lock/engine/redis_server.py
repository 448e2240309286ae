"""One Redis server (or a Sentinel group's primary, or a Redis Cluster), as the engine talks to
it: scripts registered and run, the connections kept for acquire and release
(:class:`PinnedConnections`), redis-py's errors said as ``LockError`` (:mod:`.server_errors`).

Every lock kind of one server (:mod:`.kinds`) holds this object and runs its own scripts
through it; none knows how a script reaches the server. On a Redis Cluster every script runs
through the client, which sends it to the primary of its keys' slot (each lock's keys share one
hash tag) and follows MOVED, ASK and failovers itself.

Three parts, one job between them (how a command reaches the server):

**Kept connections** (:class:`PinnedConnections`): those a locker keeps checked out of its
client's pool, for acquire and release.

Why not ``client.execute_command``: redis-py checks a connection out of the pool for every
command and, at each checkout, polls the socket for a stale reply. On a small machine that
costs more than the lock's own work (measured with ``python -m bench fastpath``: 3-5 % of a
no-op task's throughput for the acquire alone). A locker instead keeps the connections its
threads use checked out (one per thread at a time, taken back after each command) and keeps
them clean itself: any exception in the middle of a command (a timeout, a soft time limit, an
interrupt) disconnects the connection, so a stale reply can never be read as the answer to a
later command. Connections, their protocol, TLS, authentication, health checks and retry policy
are still redis-py's own, and scripts still run through redis-py's ``Script`` objects:
:class:`PinnedConnections` offers the two calls a ``Script`` makes of its client.

With a ``BlockingConnectionPool`` (a hard cap on connections) nothing is kept checked out: each
command takes a connection from the pool and gives it back, so the locker never starves the
renewer or the application of one.

A command sent with :meth:`PinnedConnections.send_later` (a release) does not wait for its
reply: the connection goes back to the idle list with the reply owed, and the reply is read
before anything else is sent on that connection (the next acquire of the same thread takes the
same, most recently used, connection), or by :meth:`PinnedConnections.settle_idle` (the
renewer, when no command followed within :data:`.renewer.SETTLE_WITHIN`; a close). Measured:
~100 us per task, the release's wait (see ``python -m bench fastpath``).

The hot path's commands (every acquire, the deferred release) are packed here
(:meth:`PinnedConnections.pack`, RESP as redis-py sends it, in the client's ``encoding``) and sent
with redis-py's ``send_packed_command``: redis-py's general packer costs a few microseconds more per
command. An acquire (:meth:`PinnedConnections.call_packed`) is sent before the reply a release still
owes on its connection is read: the two are answered in order, and reading the first overlaps the
second's round trip, as a pipeline would.

**Script calls** (:func:`run`): one path, redis-py's ``Script`` call, for every way a script
is sent.

A ``Script`` sends ``EVALSHA`` through whatever client it is given and, on ``NOSCRIPT`` (a
restarted server, a promoted replica, a node that never saw it), loads the script with that
client's ``script_load`` and sends it again. Two calls need more than one command per send, so
each gets a small client of its own that ``Script`` calls like any other, and the reload is
still ``Script``'s:

* :class:`Acknowledged`: the script then ``WAIT`` on one kept connection (``WAIT`` counts the
  replicas that acknowledged that connection's writes); the script's reply and the count.
* :class:`EachKey`: one call per ``(keys, args)`` in one pipeline (on a cluster one round trip
  per node); every reply.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections import deque
from typing import Any, Callable, Optional

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import DataError, NoScriptError, RedisError, ResponseError

from celery_singleton_lock.engine import server_errors
from celery_singleton_lock.engine.fork_safety import reset_in_forked_children
from celery_singleton_lock.engine.reading import Client

log = logging.getLogger("celery_singleton_lock.release")

#: Called with a deferred command's reply (or its error) once read.
Settle = Callable[[Any, Optional[BaseException]], None]


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
    return functools.partial(get_connection, "EVALSHA")


class PinnedConnections:
    """The connections one locker keeps checked out of ``client``'s pool; see the module doc.

    Thread-safe: a connection is used by one thread at a time (taken from an idle list and put
    back after each command). A forked child never touches its parent's connections
    (:mod:`.fork_safety`); redis-py's pool hands it fresh ones.
    """

    def __init__(self, client: redis.Redis) -> None:
        self._pool = client.connection_pool
        self._get_connection = _connection_getter(self._pool)
        #: False for a BlockingConnectionPool: connections go back to the pool after each use.
        self.keeps_connections = not isinstance(self._pool, redis.BlockingConnectionPool)
        self._idle: deque[Any] = deque()  # pop and append are atomic: no lock needed
        #: connection -> what to call with the reply it still owes (see send_later)
        self._owed: dict[Any, Settle] = {}
        kwargs = getattr(self._pool, "connection_kwargs", {})
        #: how str parts are encoded: as the client's connections encode them (redis-py's
        #: ``encoding`` and ``encoding_errors`` options), so a key is the same bytes either way
        self.encoding: tuple[str, str] = (
            kwargs.get("encoding", "utf-8"),
            kwargs.get("encoding_errors", "strict"),
        )
        self._starts: dict[tuple[Any, ...], tuple[int, bytes]] = {}
        reset_in_forked_children(self)

    def after_fork_in_child(self) -> None:
        self._idle = deque()
        self._owed = {}  # the parent's replies are the parent's to read

    def call(self, *command: Any) -> Any:
        """Send ``command`` and return its reply, as ``client.execute_command`` would.

        Connection errors are retried by the connection's own retry policy. An error reply
        raises redis-py's exception for it (e.g. ``NoScriptError``).
        """
        return self.call_with(lambda connection: self._round_trip(connection, command))

    def call_with(self, exchange: Callable[[Any], Any], *, settle_first: bool = True) -> Any:
        """``exchange(connection)`` on a kept connection, retried by its retry policy; the
        connection is dropped if it stops in the middle (a reply may still be on its way).
        ``settle_first``: read the reply the connection owes before (else ``exchange`` does,
        after sending its own command: :meth:`call_packed`)."""
        try:
            connection = self._idle.pop()  # the most recently used: its socket is warm
        except IndexError:
            connection = self._get_connection()
        if settle_first and self._owed:
            self._settle(connection)
        try:
            return connection.retry.call_with_retry(
                lambda: exchange(connection),
                lambda error: connection.disconnect(),
            )
        except ResponseError:
            raise  # the reply was read: the connection is clean
        except BaseException:
            connection.disconnect()  # a reply may still be on its way: never read it later
            raise
        finally:
            if self.keeps_connections:
                self._idle.append(connection)
            else:
                self._pool.release(connection)

    def pack(self, *command: str | bytes | float, start: tuple[int, bytes] = (0, b"")) -> bytes:
        """``command`` in RESP, as redis-py would send it (str parts in the client's encoding),
        after ``start`` (:meth:`start`: the parts every such command begins with, packed once).

        Raises:
            DataError: a part that is not a str, bytes, int or float (redis-py refuses it too).
        """
        return b"*%d\r\n%b%b" % (start[0] + len(command), start[1], self.parts(*command))

    def parts(self, *command: str | bytes | float) -> bytes:
        """Parts of a command in RESP, without the count that heads a whole command: to pack
        once what many commands share (:meth:`pack`, :meth:`start`)."""
        encoding, errors = self.encoding
        out = []
        for part in command:
            kind = type(part)
            if kind is str:
                data = part.encode(encoding, errors)  # type: ignore[union-attr]
            elif kind is bytes:
                data = part
            elif kind is int or kind is float:
                data = repr(part).encode()  # as redis-py's Encoder
            else:  # as redis-py refuses it (a bool, None, ...)
                raise DataError(f"cannot send {part!r} ({kind.__name__}) to Redis")
            out.append(b"$%d\r\n%b\r\n" % (len(data), data))
        return b"".join(out)

    def start(self, *parts: str | bytes | float) -> tuple[int, bytes]:
        """The first ``parts`` of a command, packed once for :meth:`pack` (``EVALSHA`` and a
        script's SHA, ``EVAL`` and a script's text): not encoded again for every command."""
        packed = self._starts.get(parts)
        if packed is None:
            packed = self._starts[parts] = (len(parts), self.parts(*parts))
        return packed

    def call_packed(self, packed: bytes) -> Any:
        """``call`` for a command already packed (:meth:`pack`): sent first, then the reply a
        release still owes on the connection is read and reported, then this command's.

        The hot path (every acquire): on an idle kept connection it is one send and one read,
        without the retry wrapper's frames. If that connection fails (a server restarted
        since it was last used, say), the command goes the retrying way of :meth:`call_with`,
        as redis-py's own pool reconnects a stale connection it hands out before counting
        any retry.
        """
        idle = self._idle
        if idle and self.keeps_connections:
            connection = idle.pop()  # the most recently used: its socket is warm
            try:
                reply = self._send_settle_read(connection, packed)
            except ResponseError:
                idle.append(connection)  # the reply was read: the connection is clean
                raise
            except (redis.ConnectionError, redis.TimeoutError):
                connection.disconnect()  # a reply may still be on its way: never read it
                idle.append(connection)
            except BaseException:
                connection.disconnect()
                idle.append(connection)
                raise
            else:
                idle.append(connection)
                return reply
        return self.call_with(
            lambda connection: self._send_settle_read(connection, packed), settle_first=False
        )

    def _send_settle_read(self, connection: Any, packed: bytes) -> Any:
        try:
            connection.send_packed_command((packed,))
        except BaseException as exc:
            # redis-py has dropped the connection: a reply it owed can never be read
            self._abandon(connection, exc)
            raise
        if self._owed:
            self._settle(connection)
        return connection.read_response()

    def _abandon(self, connection: Any, error: BaseException) -> None:
        """Report the reply ``connection`` owed (if any) as lost with ``error``."""
        settle = self._owed.pop(connection, None)
        if settle is not None:
            lost = error if isinstance(error, (RedisError, OSError)) else RedisError(str(error))
            try:
                settle(None, lost)
            except Exception:  # a receiver's bug must not hide the caller's error
                log.exception("reporting a deferred reply failed")

    def send_later(self, command: bytes, settle: Settle) -> bool:
        """Send ``command`` (packed: :meth:`pack`) without waiting for its reply;
        ``settle(reply, error)`` is called once it is read: before or just after the next
        command on that connection, or by :meth:`settle_idle`. False (nothing sent) when
        connections are not kept (a ``BlockingConnectionPool``) or the send failed: then send
        it the usual way.
        """
        if not self.keeps_connections:
            return False
        try:
            connection = self._idle.pop()
        except IndexError:
            connection = self._get_connection()
        if self._owed:
            self._settle(connection)
        try:
            connection.send_packed_command((command,))
        except (RedisError, OSError):
            connection.disconnect()  # part of the command may have gone: never read it
            self._idle.append(connection)
            return False
        except BaseException:  # interrupted (a time limit): the caller gets it
            connection.disconnect()
            self._idle.append(connection)
            raise
        self._owed[connection] = settle
        self._idle.append(connection)
        return True

    def _settle(self, connection: Any) -> None:
        """Read the reply ``connection`` owes, if any, and hand it over. Never raises: the
        caller's own command comes next (a connection that failed is reconnected by it)."""
        settle = self._owed.pop(connection, None)
        if settle is None:
            return
        reply: Any = None
        error: Optional[BaseException] = None
        try:
            reply = connection.read_response()
        except ResponseError as exc:
            error = exc
        except (RedisError, OSError) as exc:  # unusable: a fresh one for what follows
            connection.disconnect()
            error = exc
        except BaseException:  # interrupted (a time limit) mid-read: never read it later
            connection.disconnect()
            raise
        try:
            settle(reply, error)
        except Exception:  # a receiver's bug must not fail the next acquire
            log.exception("reporting a deferred reply failed")

    def owed(self) -> tuple[Settle, ...]:
        """What is waiting for a deferred reply now (one per connection owing one): the
        renewer compares two looks to tell a reply nobody reads (an idle worker) from one the
        next command will read (:meth:`.renewer.Renewer.settle_soon`)."""
        return tuple(self._owed.values())

    def settle_idle(self) -> None:
        """Read every reply still owed by an idle connection (each taken in turn, so a thread
        needing one meanwhile takes another)."""
        for _ in range(len(self._idle)):
            if not self._owed:
                return
            try:
                connection = self._idle.popleft()
            except IndexError:
                return
            self._settle(connection)
            self._idle.append(connection)

    @staticmethod
    def _round_trip(connection: Any, command: tuple[Any, ...]) -> Any:
        connection.send_command(*command)
        return connection.read_response()

    def call_many(self, *commands: tuple[Any, ...]) -> list[Any]:
        """Send ``commands`` together on ONE connection and return their replies in order;
        an error reply is returned as its exception, not raised. For commands that must share
        a connection (``WAIT`` counts the replicas that acknowledged that connection's writes).
        """
        replies: list[Any] = self.call_with(lambda conn: self._pipelined(conn, commands))
        return replies

    @staticmethod
    def _pipelined(connection: Any, commands: tuple[tuple[Any, ...], ...]) -> list[Any]:
        connection.send_packed_command(connection.pack_commands(commands))
        replies = []
        for _ in commands:
            try:
                replies.append(connection.read_response())
            except ResponseError as exc:
                replies.append(exc)
        return replies

    # What a redis-py ``Script`` calls on its client, so scripts run here through ``Script``.

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        return self.call("EVALSHA", sha, numkeys, *keys_and_args)

    def script_load(self, script: Any) -> str:
        sha = self.call("SCRIPT", "LOAD", script)
        return sha.decode("ascii") if isinstance(sha, bytes) else str(sha)

    def close(self) -> None:
        """Read the replies still owed, then give every idle connection back to the pool."""
        self.settle_idle()
        while True:
            try:
                connection = self._idle.pop()
            except IndexError:
                return
            self._pool.release(connection)

    def __len__(self) -> int:
        """Connections kept idle now."""
        return len(self._idle)


# -- script calls ---------------------------------------------------------------------------------


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


@functools.cache
def compact(text: str) -> str:
    """``text`` (a script) without its comment lines and indentation: what is sent as EVAL,
    whose whole text the server reads and hashes at every call (RELEASE: 3.1 kB -> 1.5 kB).
    The scripts have no long strings or block comments, so no line is cut wrongly."""
    lines = (line.strip() for line in text.splitlines())
    return "\n".join(line for line in lines if line and not line.startswith("--"))


def run(script: Script, key: str, keys: list[str], args: list[Any], client: Any) -> Any:
    """``script`` through ``client`` (EVALSHA, loading it on NOSCRIPT); redis-py's errors said
    as ``LockError`` about ``key``."""
    return server_errors.call(lambda: script(keys=keys, args=args, client=client), key)


class Acknowledged:
    """A ``Script`` client sending the script and ``WAIT replicas timeout`` together on one kept
    connection; ``evalsha`` returns ``(reply, replicas that acknowledged)``."""

    def __init__(self, connections: PinnedConnections, replicas: int, timeout: float) -> None:
        self._connections = connections
        self._wait = ("WAIT", replicas, _ms(timeout))

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> tuple[Any, int]:
        reply, acknowledged = self._connections.call_many(
            ("EVALSHA", sha, numkeys, *keys_and_args), self._wait
        )
        if isinstance(reply, Exception):
            raise reply  # NoScriptError: Script loads it and calls again
        return reply, int(acknowledged)

    def script_load(self, script: Any) -> str:
        return self._connections.script_load(script)


class EachKey:
    """A ``Script`` client sending the script once per ``(keys, args)`` of ``calls`` in one
    pipeline (a cluster's, or a server's: the chunks of a renewal, :mod:`.server_renewal`);
    ``evalsha`` (called without keys) returns every reply.

    redis-py's cluster pipeline refuses ``evalsha()``, and its pipelines load scripts with a
    ``SCRIPT EXISTS`` round trip at every send: the EVALSHA commands are sent as they are and,
    when a server does not know the script, ``Script`` loads it (on a cluster on every primary)
    and the pipeline is sent once more (the renew scripts only replace TTLs: sending one again
    is harmless). On a cluster each command names the node of its key from the client's slot
    map: without it, redis-py 8 asks a server for the keys of every EVALSHA in a pipeline
    (``COMMAND GETKEYS``, one round trip each). A command sent to a node that lost the slot is
    redirected (MOVED) by redis-py as any other.
    """

    def __init__(self, client: Any, calls: list[tuple[list[str], list[Any]]]) -> None:
        self._client = client
        self._calls = calls
        self.script_load: Callable[[Any], str] = client.script_load

    def evalsha(self, sha: str, numkeys: int, *unused: Any) -> list[Any]:
        client = self._client
        cluster = isinstance(client, RedisCluster)
        pipe = client.pipeline(transaction=False)
        for keys, args in self._calls:
            node = {"target_nodes": client.get_node_from_key(keys[0])} if cluster else {}
            pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args, **node)
        replies: list[Any] = pipe.execute(raise_on_error=False)
        for reply in replies:
            if isinstance(reply, NoScriptError):
                raise reply
        for reply, (keys, _) in zip(replies, self._calls):
            if isinstance(reply, Exception):
                raise server_errors.translate(reply, keys[0])
        return replies


# -- the server ----------------------------------------------------------------------------------


class RedisServer:
    """Talks to the server of ``client`` (see the module docstring)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        #: True for a Redis Cluster client: scripts run through it, renewal per node.
        self.cluster = isinstance(client, RedisCluster)
        #: Acquire/release connections kept out of the pool (None on a cluster: pool per node).
        self.connections = None if isinstance(client, RedisCluster) else PinnedConnections(client)
        self._pinned: Any = self.connections if self.connections is not None else client

    def register(self, text: str) -> Script:
        """The script ``text``, to run with :meth:`run` (loaded on the server at first use)."""
        return self.client.register_script(text)

    def run(
        self, script: Script, key: str, keys: list[str], args: list[Any], *, pinned: bool = False
    ) -> Any:
        """Run ``script`` (EVALSHA, loading it on NOSCRIPT), on the kept connections when
        ``pinned``; redis-py's errors said as ``LockError`` about ``key``."""
        connections = self.connections
        if pinned and connections is not None:
            body = connections.parts(len(keys), *keys, *args)
            return self.evalsha_packed(script, key, 1 + len(keys) + len(args), body)
        return run(script, key, keys, args, self._pinned if pinned else self.client)

    def evalsha_packed(self, script: Script, key: str, count: int, body: bytes) -> Any:
        """``EVALSHA`` of ``script`` with the ``count`` parts packed in ``body`` (numkeys,
        KEYS, ARGV) on a kept connection, without redis-py's Script wrappers (the hot path:
        every acquire and waited release). A server that lost the script (restart, failover,
        SCRIPT FLUSH) answers NOSCRIPT: loaded, sent again. Errors said as ``LockError``
        about ``key``."""
        connections = self.connections
        assert connections is not None
        try:
            start = connections.start("EVALSHA", script.sha)
            try:
                return connections.call_packed(b"*%d\r\n%b%b" % (start[0] + count, start[1], body))
            except NoScriptError:
                script.sha = connections.script_load(script.script)
                start = connections.start("EVALSHA", script.sha)
                return connections.call_packed(b"*%d\r\n%b%b" % (start[0] + count, start[1], body))
        except server_errors.REDIS_ERRORS as exc:
            server_errors.raise_translated(exc, key)

    def run_each(self, script: Script, calls: list[tuple[list[str], list[Any]]]) -> list[int]:
        """Run ``script`` once per ``(keys, args)`` of ``calls`` in one cluster pipeline (one
        round trip per node, see :class:`EachKey`); return the indices of the
        calls whose reply names a key NOT renewed (a non-empty list, as the renew scripts
        return for a lost key)."""
        replies = run(script, calls[0][0][0], [], [], EachKey(self.client, calls))
        return [index for index, reply in enumerate(replies) if reply]

    def close(self) -> None:
        """Give back the kept connections, close the client's, and those to its sentinels if
        it has any."""
        if self.connections is not None:
            self.connections.close()
        self.client.close()
        manager = getattr(getattr(self.client, "connection_pool", None), "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            sentinel.close()
