"""A throwaway Redis Cluster on loopback: 3 primaries, optionally a replica each (real processes).

Started and stopped by the tests (:meth:`ClusterGroup.running`), every process killed and every
directory removed at the end, whatever happened. The cluster is created with redis-cli's own
``--cluster create``; failure detection is fast (``cluster-node-timeout`` 2000 ms) and every
wait is bounded in time.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from dataclasses import dataclass
from typing import Iterator

import redis
from redis.cluster import RedisCluster

from celery_singleton_lock.testing import RedisServer, free_port
from tests.support import wait_until

#: Seconds the cluster may take to come up, and a failover to complete.
READY_TIMEOUT = 30.0
FAILOVER_TIMEOUT = 30.0
NODE_TIMEOUT_MS = 2000


def _cluster_server() -> RedisServer:
    return RedisServer(
        extra_args=[
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",  # relative to the server's own directory
            "--cluster-node-timeout",
            str(NODE_TIMEOUT_MS),
            # the bus port is the client port + 10000 unless given: a free port above 55535
            # would have none
            "--cluster-port",
            str(free_port()),
            # a replica's full sync starts at once, not after Redis 7's default 5 s wait for
            # more replicas to share it
            "--repl-diskless-sync-delay",
            "0",
        ]
    )


def _start_node(server: RedisServer, attempts: int = 3) -> None:
    """Start a node of :func:`_cluster_server`. Its bus port, chosen free, may be taken before
    the server binds it (an ephemeral port of another connection), and the server exits:
    ``RedisServer.start`` chooses a new client port then, not a new bus port, so the node
    is started again here on a new bus port."""
    at = server.extra_args.index("--cluster-port") + 1
    for attempt in range(1, attempts + 1):
        try:
            server.start()
        except RuntimeError:
            if attempt == attempts:
                raise
            server.extra_args[at] = str(free_port())
        else:
            return


def _roles(nodes: str) -> dict[str, tuple[str, bool]]:
    """``CLUSTER NODES`` as {node id: (its role, whether it is the node that answered)}."""
    roles = {}
    for line in nodes.splitlines():
        node, _address, flags = line.split()[:3]
        flagged = flags.split(",")
        roles[node] = ("master" if "master" in flagged else "slave", "myself" in flagged)
    return roles


@dataclass
class Failover:
    """When a replica was promoted, as seen from the test (``time.time()`` seconds)."""

    asked_at: float
    #: the promoted replica says it is a primary
    promoted_at: float
    old_port: int
    new_port: int


class ClusterGroup:
    """3 primaries (and ``replicas`` replicas each) on 127.0.0.1; see the module docstring."""

    def __init__(self, primaries: int = 3, replicas: int = 0) -> None:
        self.servers = [_cluster_server() for _ in range(primaries * (1 + replicas))]
        self.replicas = replicas

    @property
    def url(self) -> str:
        """The URL of one node: any node's URL is a cluster client's whole configuration."""
        return f"redis://127.0.0.1:{self.servers[0].port}/0"

    def client(self) -> RedisCluster:
        """A cluster client of redis-py, for the test's own reads (from a live node)."""
        return RedisCluster(host="127.0.0.1", port=self._ports()[0], socket_timeout=5)

    def node(self, port: int) -> redis.Redis:
        """A plain client of one node."""
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, decode_responses=True)

    def primary_ports(self) -> list[int]:
        return [port for port in self._ports() if self._role(port) == "master"]

    def replica_ports(self) -> list[int]:
        return [port for port in self._ports() if self._role(port) == "slave"]

    def _ports(self) -> list[int]:
        """The ports of the nodes still running."""
        return [server.port for server in self.servers if server.process is not None]

    def _role(self, port: int) -> str:
        client = self.node(port)
        try:
            return str(client.info("replication").get("role"))
        except redis.exceptions.ConnectionError:
            return ""
        finally:
            client.close()

    # -- life cycle -----------------------------------------------------------------------------

    def start(self) -> ClusterGroup:
        for server in self.servers:
            _start_node(server)
        subprocess.run(
            ["redis-cli", "--cluster", "create"]
            + [f"127.0.0.1:{port}" for port in self._ports()]
            + ["--cluster-replicas", str(self.replicas), "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=READY_TIMEOUT,
        )
        wait_until(self._ready, timeout=READY_TIMEOUT, interval=0.1)
        return self

    def _ready(self) -> bool:
        """Every node says ``cluster_state:ok`` and knows every other node in the role it
        has, every replica in sync with its primary (a primary that still takes its replica
        for a primary refuses the replica's ``CLUSTER FAILOVER``)."""
        views = []
        for port in self._ports():
            client = self.node(port)
            try:
                info = client.execute_command("CLUSTER", "INFO")
                if isinstance(info, str):
                    info = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
                if info.get("cluster_state") != "ok":
                    return False
                if int(info.get("cluster_known_nodes", 0)) < len(self._ports()):
                    return False
                replication = client.info("replication")
                if replication.get("role") == "slave" and (
                    replication.get("master_link_status") != "up"
                ):
                    return False
                views.append(_roles(str(client.execute_command("CLUSTER", "NODES"))))
            except redis.exceptions.RedisError:
                return False
            finally:
                client.close()
        # each running node's own line (flag "myself") is the truth about it
        truth = {node: role for view in views for node, (role, myself) in view.items() if myself}
        return all(
            view.get(node, ("", False))[0] == role for view in views for node, role in truth.items()
        )

    def failover(self, timeout: float = FAILOVER_TIMEOUT) -> Failover:
        """``CLUSTER FAILOVER`` on the replica of the first primary; returns once it is a
        primary and the cluster is ok again."""
        replica_port = self.replica_ports()[0]
        client = self.node(replica_port)
        try:
            old_port = int(client.info("replication")["master_port"])
            asked = time.time()
            client.execute_command("CLUSTER", "FAILOVER")
            wait_until(lambda: self._role(replica_port) == "master", timeout, 0.01)
        finally:
            client.close()
        promoted = time.time()
        wait_until(self._ready, timeout=timeout, interval=0.1)
        return Failover(asked, promoted, old_port, replica_port)

    def crash_primary(self, timeout: float = FAILOVER_TIMEOUT) -> Failover:
        """SIGKILL the primary of the first replica; returns once the replica has been elected
        in its place (after ``cluster-node-timeout``) and the cluster is ok again."""
        replica_port = self.replica_ports()[0]
        client = self.node(replica_port)
        try:
            old_port = int(client.info("replication")["master_port"])
            asked = time.time()
            next(server for server in self.servers if server.port == old_port).stop()
            wait_until(lambda: self._role(replica_port) == "master", timeout, 0.01)
        finally:
            client.close()
        promoted = time.time()
        wait_until(self._ready, timeout=timeout, interval=0.1)
        return Failover(asked, promoted, old_port, replica_port)

    def close(self) -> None:
        for server in self.servers:
            server.close()

    @classmethod
    @contextlib.contextmanager
    def running(cls, primaries: int = 3, replicas: int = 0) -> Iterator[ClusterGroup]:
        group = cls(primaries, replicas)
        try:
            yield group.start()
        finally:
            group.close()
