"""The locker's own connections: kept out of the pool, one per thread at a time, never left
holding a stale reply, never kept when the pool is capped, and usable by redis-py's Script."""

from __future__ import annotations

import signal
import threading
import warnings
from typing import Any, Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_singleton_lock.engine.redis_server import PinnedConnections
from celery_singleton_lock.testing import RedisServer


class Interrupted(Exception):
    """Raised from a signal handler in the middle of a blocking read, as Celery's soft time
    limit is."""


@pytest.fixture
def impatient_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """Times out after 0.1 s and never retries: a command can be cut off before its reply."""
    client = redis_server.client(socket_timeout=0.1, retry=Retry(NoBackoff(), 0))
    yield client
    client.close()


def test_a_command_that_timed_out_leaves_no_reply_for_the_next_one(
    impatient_client: redis.Redis,
) -> None:
    connections = PinnedConnections(impatient_client)
    with pytest.raises(redis.exceptions.TimeoutError):
        connections.call("BLPOP", "nothing-here", "0.4")  # answers nil after 0.4 s
    assert connections.call("ECHO", "after") == b"after"


def test_a_command_interrupted_by_a_signal_leaves_no_reply_for_the_next_one(
    redis_client: redis.Redis,
) -> None:
    connections = PinnedConnections(redis_client)

    def interrupt(*_: Any) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(Interrupted):
            connections.call("BLPOP", "nothing-here", "0.4")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert connections.call("ECHO", "after") == b"after"


def test_threads_reuse_connections_instead_of_opening_one_per_command(
    redis_client: redis.Redis,
) -> None:
    connections = PinnedConnections(redis_client)
    start = threading.Barrier(4)

    def work() -> None:
        start.wait()
        for i in range(100):
            assert connections.call("ECHO", str(i)) == str(i).encode()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert 1 <= len(connections) <= 4


def test_a_capped_pool_gets_its_connection_back_after_every_command(
    redis_server: RedisServer,
) -> None:
    pool = redis.BlockingConnectionPool(
        host="127.0.0.1", port=redis_server.port, max_connections=1, timeout=1
    )
    client = redis.Redis(connection_pool=pool)
    connections = PinnedConnections(client)
    assert not connections.keeps_connections
    assert connections.call("ECHO", "ours") == b"ours"
    assert client.echo("the application's") == b"the application's"  # would time out
    pool.disconnect()


class PoolRequiringACommandName(redis.ConnectionPool):
    """A real pool with the ``get_connection`` signature of redis-py before 5.3, where the
    command name is a required argument (5.3 made it optional and deprecated it)."""

    def get_connection(self, command_name: str, *keys: Any, **options: Any) -> Any:
        with warnings.catch_warnings():  # redis-py >= 5.3 warns that the name is unused
            warnings.simplefilter("ignore", DeprecationWarning)
            return super().get_connection(command_name, *keys, **options)


def test_a_pool_that_requires_a_command_name_hands_out_connections(
    redis_server: RedisServer,
) -> None:
    pool = PoolRequiringACommandName(host="127.0.0.1", port=redis_server.port)
    connections = PinnedConnections(redis.Redis(connection_pool=pool))
    assert connections.call("ECHO", "checked out") == b"checked out"
    pool.disconnect()


def test_a_script_runs_on_them_through_redis_pys_script_object(redis_client: redis.Redis) -> None:
    connections = PinnedConnections(redis_client)
    script = redis_client.register_script("return ARGV[1]")
    redis_client.script_flush()  # the first call meets NOSCRIPT: Script loads it here
    assert script(args=["pinned"], client=connections) == b"pinned"
    assert script(args=["again"], client=connections) == b"again"


@pytest.mark.parametrize(
    "command",
    [
        ("EVALSHA", "a" * 40, 2, "P:{tâche:1}", "P:{x}:fence", 30000, "tok||17|1|h|id"),
        ("SET", b"raw\r\nbytes", -1, 2.5),
    ],
)
def test_a_command_is_packed_as_redis_py_packs_it(redis_client: redis.Redis, command: Any) -> None:
    redis_py = redis.Connection()  # packs without connecting, in the same default encoding
    assert PinnedConnections(redis_client).pack(*command) == b"".join(
        redis_py.pack_command(*command)
    )


def test_a_command_is_packed_in_the_clients_encoding(redis_server: RedisServer) -> None:
    client = redis_server.client(encoding="latin-1")
    assert PinnedConnections(client).pack("GET", "clé") == b"*2\r\n$3\r\nGET\r\n$3\r\ncl\xe9\r\n"
    client.close()


def test_a_part_redis_py_would_refuse_is_refused(redis_client: redis.Redis) -> None:
    with pytest.raises(redis.exceptions.DataError):
        PinnedConnections(redis_client).pack("SET", "k", None)  # type: ignore[arg-type]


def test_a_packed_call_reads_the_reply_owed_before_its_own(redis_client: redis.Redis) -> None:
    connections = PinnedConnections(redis_client)
    replies: list[Any] = []
    assert connections.send_later(connections.pack("ECHO", "owed"), lambda *r: replies.append(r))
    assert connections.call_packed(connections.pack("ECHO", "mine")) == b"mine"
    assert replies == [(b"owed", None)]


def test_a_reply_owed_by_a_connection_that_failed_to_send_is_reported_lost(
    impatient_client: redis.Redis, redis_server: RedisServer
) -> None:
    connections = PinnedConnections(impatient_client)
    replies: list[Any] = []
    assert connections.send_later(connections.pack("ECHO", "owed"), lambda *r: replies.append(r))
    connection = connections._idle[-1]
    connection._sock.close()  # the next send on it fails
    assert connections.call_packed(connections.pack("ECHO", "mine")) == b"mine"
    ((reply, error),) = replies
    assert reply is None and isinstance(error, redis.exceptions.ConnectionError)


def test_a_packed_call_whose_kept_connection_went_stale_is_sent_on_a_fresh_one(
    impatient_client: redis.Redis,
) -> None:
    # as redis-py's pool reconnects a stale connection it hands out, even with no retries
    connections = PinnedConnections(impatient_client)
    assert connections.call_packed(connections.pack("ECHO", "first")) == b"first"
    connections._idle[-1]._sock.close()
    assert connections.call_packed(connections.pack("ECHO", "again")) == b"again"


def test_a_packed_call_to_a_server_that_is_gone_raises_its_connection_error(
    impatient_client: redis.Redis, redis_server: RedisServer
) -> None:
    connections = PinnedConnections(impatient_client)
    assert connections.call_packed(connections.pack("ECHO", "first")) == b"first"
    redis_server.stop()
    with pytest.raises(redis.exceptions.ConnectionError):
        connections.call_packed(connections.pack("ECHO", "gone"))


def test_a_command_packed_after_its_start_is_the_whole_command_packed(
    redis_client: redis.Redis,
) -> None:
    connections = PinnedConnections(redis_client)
    start = connections.start("EVAL", "return 1")
    assert connections.start("EVAL", "return 1") is start  # packed once
    assert connections.pack(2, "k1", "k2", 30000, start=start) == connections.pack(
        "EVAL", "return 1", 2, "k1", "k2", 30000
    )
