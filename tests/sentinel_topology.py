"""A throwaway Sentinel group on loopback: 1 master, 1 replica, 3 sentinels (real processes).

Started and stopped by the tests (:meth:`SentinelGroup.running`), every process killed and
every directory removed at the end, whatever happened. Failure detection and failover are
made fast (``down-after-milliseconds`` 1000, ``failover-timeout`` 5000) and every wait is
bounded in time.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import redis

from celery_singleton_lock.testing import RedisServer, find_redis_server, free_port
from tests.support import wait_until

MASTER_NAME = "mymaster"
#: Seconds the group may take to come up, and a failover to complete.
READY_TIMEOUT = 30.0
FAILOVER_TIMEOUT = 30.0
#: a replica's full sync starts at once, not after Redis 7's default 5 s wait for more
#: replicas to share it (the replica, and the old master once demoted)
_SYNC_AT_ONCE = ["--repl-diskless-sync-delay", "0"]


class SentinelProcess:
    """One ``redis-server sentinel.conf --sentinel`` watching ``master_port``."""

    def __init__(self, master_port: int, quorum: int = 2) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="csl-sentinel-")
        self.config = Path(self.dir) / "sentinel.conf"
        # sentinel rewrites its config file: it must be a writable file of its own
        self.config.write_text(
            f"port {self.port}\n"
            "bind 127.0.0.1\n"
            "protected-mode no\n"
            f"dir {self.dir}\n"
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} {quorum}\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} 1000\n"
            f"sentinel failover-timeout {MASTER_NAME} 5000\n"
            f"sentinel parallel-syncs {MASTER_NAME} 1\n"
        )
        self.process: Optional[subprocess.Popen[bytes]] = None

    def start(self) -> SentinelProcess:
        self.process = subprocess.Popen(
            [find_redis_server(), str(self.config), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        probe = self.client()
        try:
            wait_until(lambda: _answers(probe), timeout=10)
        finally:
            probe.close()
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1",
            port=self.port,
            socket_timeout=2,
            socket_connect_timeout=1,
            decode_responses=True,
        )

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None
        shutil.rmtree(self.dir, ignore_errors=True)


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.exceptions.ConnectionError:
        return False


@dataclass
class Failover:
    """When a failover happened, as seen from the test (``time.time()`` seconds)."""

    asked_at: float
    #: the sentinels name the new master
    switched_at: float
    #: the old master says it is a replica (writes to it fail with READONLY from here)
    demoted_at: float
    old_port: int
    new_port: int


class SentinelGroup:
    """1 master, 1 replica, 3 sentinels on 127.0.0.1; see the module docstring."""

    def __init__(self) -> None:
        self.servers: list[RedisServer] = []
        self.sentinels: list[SentinelProcess] = []

    # -- what clients need ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Celery's form: ``sentinel://127.0.0.1:P1;sentinel://127.0.0.1:P2;...``."""
        return ";".join(f"sentinel://127.0.0.1:{s.port}/0" for s in self.sentinels)

    @property
    def transport_options(self) -> dict[str, Any]:
        return {"master_name": MASTER_NAME}

    def server(self, port: int) -> RedisServer:
        return next(server for server in self.servers if server.port == port)

    def master_port(self) -> int:
        """The master's port as the first sentinel that answers names it."""
        for sentinel in self.sentinels:
            client = sentinel.client()
            try:
                _host, port = client.sentinel_get_master_addr_by_name(MASTER_NAME)
                return int(port)
            except redis.exceptions.ConnectionError:
                continue
            finally:
                client.close()
        raise RuntimeError("no sentinel answers")

    def master(self) -> redis.Redis:
        """A plain client of the current master (for the test's own reads)."""
        return self.server(self.master_port()).client(socket_timeout=5, decode_responses=True)

    # -- life cycle -----------------------------------------------------------------------------

    def start(self) -> SentinelGroup:
        master = RedisServer(extra_args=_SYNC_AT_ONCE).start()
        self.servers.append(master)
        replica = RedisServer(
            extra_args=[*_SYNC_AT_ONCE, "--replicaof", "127.0.0.1", str(master.port)]
        )
        self.servers.append(replica.start())
        probe = master.client(decode_responses=True)
        try:
            # the replica is in sync before the sentinels look (they find it in the master's INFO)
            wait_until(lambda: probe.info("replication").get("connected_slaves") == 1, 15)
        finally:
            probe.close()
        for _ in range(3):
            self.sentinels.append(SentinelProcess(master.port).start())
        wait_until(self._ready, timeout=READY_TIMEOUT, interval=0.1)
        return self

    def _ready(self) -> bool:
        """Every sentinel knows the replica (in sync) and the two other sentinels."""
        for sentinel in self.sentinels:
            client = sentinel.client()
            try:
                replicas = client.execute_command("SENTINEL", "REPLICAS", MASTER_NAME)
                others = client.execute_command("SENTINEL", "SENTINELS", MASTER_NAME)
            except redis.exceptions.RedisError:
                return False
            finally:
                client.close()
            healthy = [
                fields
                for fields in map(_pairs, replicas)
                if fields.get("flags") == "slave" and fields.get("master-link-status") == "ok"
            ]
            if not healthy or len(others) < 2:
                return False
        return True

    def failover(
        self,
        timeout: float = FAILOVER_TIMEOUT,
        during_switch: Optional[Callable[[], None]] = None,
    ) -> Failover:
        """``SENTINEL FAILOVER``; returns once the old master is a replica of the new one.

        ``during_switch`` is called once the sentinels name the new master, before the old
        one is demoted (Sentinel waits some seconds before it reconfigures the old master,
        which meanwhile still accepts writes: whatever is written there is lost).

        The group is waited for to be ready (the demoted master back in sync and known to
        every sentinel) before a failover, not after one: that takes seconds, and only a
        next failover needs it.
        """
        wait_until(self._ready, timeout=timeout, interval=0.1)
        old_port = self.master_port()
        asked = time.time()
        client = self.sentinels[0].client()
        try:
            client.execute_command("SENTINEL", "FAILOVER", MASTER_NAME)
        finally:
            client.close()
        new_port = wait_until(
            lambda: (port := self.master_port()) != old_port and port, timeout, 0.01
        )
        switched = time.time()
        if during_switch is not None:
            during_switch()
        old = self.server(old_port).client(socket_timeout=2, decode_responses=True)
        try:
            wait_until(lambda: _role(old) == "slave", timeout, 0.01)
        finally:
            old.close()
        demoted = time.time()
        return Failover(asked, switched, demoted, old_port, new_port)

    def close(self) -> None:
        for sentinel in self.sentinels:
            sentinel.close()
        for server in self.servers:
            server.close()

    @classmethod
    @contextlib.contextmanager
    def running(cls) -> Iterator[SentinelGroup]:
        group = cls()
        try:
            yield group.start()
        finally:
            group.close()


def _pairs(flat: Any) -> dict[str, str]:
    """A sentinel reply ``[k1, v1, k2, v2...]`` (or a dict, under RESP3) as a dict."""
    if isinstance(flat, dict):
        return {str(k): str(v) for k, v in flat.items()}
    return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}


def _role(client: redis.Redis) -> str:
    try:
        return str(client.info("replication").get("role"))
    except redis.exceptions.ConnectionError:
        return ""
