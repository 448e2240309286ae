"""How a locker sends a script: one path, redis-py's ``Script`` call, for every way it is sent.

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
from typing import Any, Callable

from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from celery_singleton_lock.engine import server_errors
from celery_singleton_lock.engine.pinned import PinnedConnections


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
