"""A process's few kept connections to one PostgreSQL database, fork-safe, and psycopg's errors
said as ours.

Each statement runs on a connection taken from the idle ones (or a new one) and put back after:
autocommit, so one statement is one transaction and nothing holds a session state between
statements; server-side prepared statements are off (``prepare_threshold=None``). Both make it
work through PgBouncer in transaction mode. A connection that fails is dropped, never put back.

A kept connection the server closed while it sat idle (PostgreSQL restarted, or PgBouncer's
``client_idle_timeout``) has its socket readable: the server's goodbye and the end of the
stream, where an idle connection that LISTENs to nothing has nothing to read. It is dropped
before use (a ``poll`` of the socket, no round trip) and the statement goes on a new
connection, so the first acquire and the first renewal after a restart do not fail on a dead
socket.

Fork safety: a forked child (a prefork pool child) never uses, closes nor frees its parent's
connections (freeing one would send the server a terminate on the parent's socket): it keeps a
reference to each for good and starts with none of its own.
"""

from __future__ import annotations

import contextlib
import select
import threading
from typing import Any, Iterator, Optional, Sequence
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from celery_singleton_lock.engine.fork_safety import reset_in_forked_children
from celery_singleton_lock.errors import LockBackendUnavailable, LockError

#: Idle connections kept per process (the worker's main thread, the renewer, a waiter...).
KEEP = 4
#: Seconds a new connection may take before the server counts as unreachable.
CONNECT_TIMEOUT = 2
#: libpq's socket settings unless the URL gives its own: a server gone without a word (a
#: network partition) fails a statement within seconds, as the Redis client's socket timeout
#: does, rather than at the kernel's TCP timeout (minutes) with the renewer stuck behind it.
SOCKET_DEFAULTS = {
    "connect_timeout": CONNECT_TIMEOUT,
    "tcp_user_timeout": 5000,  # ms of sent data unacknowledged
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 2,
}

Row = tuple[Any, ...]
Connection = psycopg.Connection[Row]


def split_url(url: str) -> tuple[str, str]:
    """``(conninfo, schema)`` of a lock URL: ``postgresql://...?schema=S`` names the schema of
    the lock tables (``public`` by default); every other parameter is libpq's."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((value for key, value in query if key == "schema"), "public")
    rest = urlencode([(key, value) for key, value in query if key != "schema"])
    return urlunsplit(parts._replace(query=rest)), schema


def where(conninfo: str) -> str:
    """``host:port/db`` of ``conninfo``, password left out, for messages (a multi-host URL,
    ``host1:port1,host2:port2``, as written)."""
    parts = urlsplit(conninfo)
    hosts = parts.netloc.rpartition("@")[2]
    if "," in hosts:
        return f"{hosts}{parts.path}"
    return f"{parts.hostname or 'localhost'}:{parts.port or 5432}{parts.path}"


def unavailable(exc: BaseException, conninfo: str, key: Optional[str]) -> LockError:
    """``exc`` (a psycopg error) said as ours: the server out of reach, or what it refused."""
    said = f"PostgreSQL lock server {where(conninfo)}: {type(exc).__name__}: {exc}".strip()
    if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
        return LockBackendUnavailable(said, key)
    return LockError(said, key)


def _closed_by_server(connection: Connection) -> bool:
    """True if the idle ``connection`` is closed, or its socket has something to read (the
    server's goodbye, or the end of the stream: see the module), without waiting. Reading
    it instead (libpq's ``consume_input``) misses the goodbye that comes before the end of the
    stream; and PostgreSQL sends nothing else unasked to an idle connection (no TLS session
    tickets: it turns them off)."""
    if connection.closed:
        return True
    try:
        return _readable(connection.fileno())
    except (OSError, ValueError, psycopg.Error):
        return True


def _readable(fd: int) -> bool:
    """Whether ``fd`` has something to read or was hung up, now. ``poll`` where there is one:
    ``select`` refuses a descriptor above 1023, which a busy worker may reach."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


class Connections:
    """Kept connections to ``conninfo`` for this process (see the module)."""

    def __init__(self, conninfo: str, *, keep: int = KEEP) -> None:
        self.conninfo = conninfo
        self.keep = keep
        #: statements sent, for tests and benchmarks (a renewal tick is one)
        self.statements = 0
        #: the parent's connections in a forked child: kept, never used nor freed
        self._inherited: list[Connection] = []
        self._reset()
        reset_in_forked_children(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[Connection] = []
        self._open: set[Connection] = set()

    def after_fork_in_child(self) -> None:
        self._inherited.extend(self._open)
        self._reset()

    def connect(self) -> Connection:
        """A new autocommit connection of this process's own (the caller closes it)."""
        given = conninfo_to_dict(self.conninfo)
        defaults = {key: value for key, value in SOCKET_DEFAULTS.items() if key not in given}
        conninfo = make_conninfo(self.conninfo, **defaults)
        connection: Connection = psycopg.connect(conninfo, autocommit=True, prepare_threshold=None)
        return connection

    @contextlib.contextmanager
    def connection(self, key: Optional[str] = None) -> Iterator[Connection]:
        """A kept connection for the ``with`` block, psycopg's errors said as ours."""
        connection = self._take_idle()
        try:
            if connection is None:
                connection = self.connect()
                with self._lock:
                    self._open.add(connection)
            yield connection
        except psycopg.Error as exc:
            if connection is not None:
                self._drop(connection)
            raise unavailable(exc, self.conninfo, key) from exc
        except BaseException:
            if connection is not None:
                self._drop(connection)  # its state is not known: a statement may be running
            raise
        else:
            with self._lock:
                if len(self._idle) < self.keep and not connection.closed:
                    self._idle.append(connection)
                    return
            self._drop(connection)

    def run(self, sql: str, params: Any, key: Optional[str] = None) -> list[Row]:
        """The rows of one statement (one transaction)."""
        with self.connection(key) as connection:
            self.statements += 1
            cursor = connection.execute(sql, params)
            return cursor.fetchall() if cursor.description is not None else []

    def read(self, sql: str, params: Any, key: Optional[str] = None) -> list[Row]:
        """The rows of a read; none when a table it reads does not exist yet (no worker of
        this version has used the schema, nor ``celery locks migrate``): nothing was ever
        written there."""
        try:
            return self.run(sql, params, key)
        except LockError as exc:
            if isinstance(exc.__cause__, psycopg.errors.UndefinedTable):
                return []
            raise

    def transaction(self, statements: Sequence[tuple[str, Any]], key: Optional[str] = None) -> None:
        """``statements`` in one transaction."""
        with self.connection(key) as connection, connection.transaction():
            for sql, params in statements:
                self.statements += 1
                connection.execute(sql, params)

    def _take_idle(self) -> Optional[Connection]:
        """A kept connection still open (the closed ones dropped on the way), or None."""
        while True:
            with self._lock:
                connection = self._idle.pop() if self._idle else None
            if connection is None or not _closed_by_server(connection):
                return connection
            self._drop(connection)

    def _drop(self, connection: Connection) -> None:
        with self._lock:
            self._open.discard(connection)
            if connection in self._idle:
                self._idle.remove(connection)
        with contextlib.suppress(Exception):
            connection.close()

    def close(self) -> None:
        """Close this process's connections (a child's inherited ones are left alone)."""
        with self._lock:
            connections, self._idle, self._open = list(self._open), [], set()
        for connection in connections:
            with contextlib.suppress(Exception):
                connection.close()
