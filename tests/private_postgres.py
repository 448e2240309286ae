"""A PostgreSQL server of a test's own (``initdb`` and ``pg_ctl`` of PostgreSQL 15, into a
temporary directory, on a free loopback port), for what the shared one at 127.0.0.1:5432 must
never suffer: a restart. Always stopped and removed at the end; a skip where the binaries are
missing. As root, the server runs as the ``postgres`` user (``initdb`` refuses root)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from celery_singleton_lock.testing import free_port

BIN = Path(os.environ.get("CSL_PG_BIN", "/usr/lib/postgresql/15/bin"))


class PrivatePostgres:
    """One server in ``directory`` on ``port`` (see the module)."""

    def __init__(self, directory: Path, port: int) -> None:
        self.directory = directory
        self.data = directory / "data"
        self.port = port
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def _run(self, *args: str, timeout: float = 60) -> None:
        command = [str(BIN / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=timeout)

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.directory / "server.log")
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", log, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        self.stop()
        self.start()


@contextlib.contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    """A started :class:`PrivatePostgres`, stopped and removed at the end."""
    if not (BIN / "initdb").exists():
        pytest.skip(f"no PostgreSQL binaries in {BIN}")
    directory = Path(tempfile.mkdtemp(prefix="csl-pg-"))
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(directory, user.pw_uid, user.pw_gid)
    server = PrivatePostgres(directory, free_port())
    try:
        server.init()
        server.start()
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.stop("immediate")
        shutil.rmtree(directory, ignore_errors=True)
