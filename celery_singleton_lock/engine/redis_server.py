"""One Redis server (or a Sentinel group's primary, or a Redis Cluster), as the engine talks to
it: scripts registered and run, the connections kept for acquire and release (:mod:`.pinned`),
redis-py's errors said as ``LockError`` (:mod:`.server_errors`).

Every lock kind of one server (:mod:`.kinds`) holds this object and runs its own scripts
through it; none knows how a script reaches the server. On a Redis Cluster every script runs
through the client, which sends it to the primary of its keys' slot (each lock's keys share one
hash tag) and follows MOVED, ASK and failovers itself.
"""

from __future__ import annotations

from typing import Any

from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from celery_singleton_lock.engine import script_calls, server_errors
from celery_singleton_lock.engine.pinned import PinnedConnections
from celery_singleton_lock.engine.reading import Client
from celery_singleton_lock.engine.script_calls import EachKey


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
        return script_calls.run(script, key, keys, args, self._pinned if pinned else self.client)

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
        round trip per node, see :class:`~.script_calls.EachKey`); return the indices of the
        calls whose reply names a key NOT renewed (a non-empty list, as the renew scripts
        return for a lost key)."""
        replies = script_calls.run(script, calls[0][0][0], [], [], EachKey(self.client, calls))
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
