"""Private PostgreSQL and PgBouncer servers for the tests that stop, crash or pool them (the
shared PostgreSQL at 127.0.0.1:5432 is never stopped: other tests use it).

:class:`PrivatePostgres` runs ``initdb`` and ``pg_ctl`` (``pg_config --bindir``, else
``/usr/lib/postgresql/*/bin``) into a temporary directory, on a free loopback port, trust auth;
:class:`PrivatePgBouncer` runs ``pgbouncer`` in transaction mode in front of a database. Both
refuse to run as root (``initdb`` and ``pgbouncer`` say so): as root they run as the
``postgres`` OS user through ``runuser``. Missing binaries or no such user: the test skips with
the reason. Both are always stopped and their directory removed.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional, Sequence

import pytest


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def postgres_bindir() -> Optional[Path]:
    """The directory of ``initdb`` and ``pg_ctl``, or None."""
    candidates: list[str] = []
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        found = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, timeout=10, check=True
        )
        candidates.append(found.stdout.strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for candidate in candidates:
        if candidate and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    return None


class RunAs:
    """Runs commands as this user, or as ``postgres`` when this user is root."""

    def __init__(self) -> None:
        self.prefix: list[str] = []
        self.uid: Optional[int] = None
        self.gid: Optional[int] = None
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                pytest.skip("running as root and no 'postgres' OS user: initdb refuses root")
            runuser = shutil.which("runuser")
            if runuser is None:
                pytest.skip("running as root and no runuser to run initdb as 'postgres'")
            self.prefix = [runuser, "-u", "postgres", "--"]
            self.uid, self.gid = user.pw_uid, user.pw_gid

    def own(self, path: Path) -> None:
        if self.uid is not None and self.gid is not None:
            os.chown(path, self.uid, self.gid)

    def run(self, command: Sequence[str], timeout: float = 120) -> str:
        done = subprocess.run(
            [*self.prefix, *command], capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            raise RuntimeError(f"{command[0]} failed ({done.returncode}): {done.stderr[-2000:]}")
        return done.stdout

    def start(self, command: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            return subprocess.Popen(
                [*self.prefix, *command],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )


def answers(url: str, timeout: float = 2) -> bool:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=timeout) as connection:
            connection.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


class PrivatePostgres:
    """A PostgreSQL of the test's own in ``directory``; :meth:`stop` and :meth:`start` may be
    called any number of times (a restart), :meth:`destroy` removes it all."""

    def __init__(
        self,
        bindir: Path,
        directory: Path,
        run_as: RunAs,
        standby_of: Optional[PrivatePostgres] = None,
    ) -> None:
        self.bindir, self.directory, self.run_as = bindir, directory, run_as
        self.data = directory / "data"
        self.log = directory / "postgres.log"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        if standby_of is None:
            run_as.run([str(bindir / "initdb"), "-D", str(self.data), "-A", "trust",
                        "-U", "postgres", "--no-sync", "-E", "UTF8"])  # fmt: skip
        else:
            # a streaming replica: a base backup with standby.signal and primary_conninfo (-R)
            run_as.run([str(bindir / "pg_basebackup"), "-h", "127.0.0.1", "-p",
                        str(standby_of.port), "-U", "postgres", "-D", str(self.data), "-R",
                        "-X", "stream", "--no-sync"])  # fmt: skip
        with open(self.data / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{directory}'\nmax_connections = 100\n"
            )

    def pg_ctl(self, *arguments: str, timeout: float = 120) -> str:
        return self.run_as.run(
            [str(self.bindir / "pg_ctl"), "-D", str(self.data), *arguments], timeout=timeout
        )

    def start(self) -> None:
        """Start it and wait until it takes connections."""
        self.pg_ctl("-l", str(self.log), "-w", "-t", "90", "start")
        deadline = time.monotonic() + 60
        while not answers(self.url):
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL on port {self.port} does not answer")
            time.sleep(0.1)

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m mode``: ``fast`` (a clean shutdown, a checkpoint) or ``immediate``
        (a crash: no checkpoint, WAL replayed at the next start)."""
        self.pg_ctl("-m", mode, "-w", "-t", "90", "stop")

    def restart(self) -> None:
        """A clean stop (``fast``), then a start, waited for until it answers."""
        self.stop("fast")
        self.start()

    def promote(self) -> None:
        """Promote this standby to a primary (``pg_ctl promote``, waited for)."""
        self.pg_ctl("-w", "-t", "90", "promote")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            if self.running():
                self.stop("immediate")
        shutil.rmtree(self.directory, ignore_errors=True)


@contextlib.contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    """A running :class:`PrivatePostgres`, stopped and removed at the end."""
    bindir = postgres_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl): pg_config --bindir failed")
    run_as = RunAs()
    directory = Path(tempfile.mkdtemp(prefix="csl-pg-"))
    run_as.own(directory)
    server: Optional[PrivatePostgres] = None
    try:
        server = PrivatePostgres(bindir, directory, run_as)
        server.start()
        yield server
    finally:
        if server is not None:
            server.destroy()
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def private_standby(primary: PrivatePostgres) -> Iterator[PrivatePostgres]:
    """A running streaming standby of ``primary`` (asynchronous), stopped and removed at the
    end."""
    directory = Path(tempfile.mkdtemp(prefix="csl-pg-standby-"))
    primary.run_as.own(directory)
    server: Optional[PrivatePostgres] = None
    try:
        server = PrivatePostgres(primary.bindir, directory, primary.run_as, standby_of=primary)
        server.start()
        yield server
    finally:
        if server is not None:
            server.destroy()
        shutil.rmtree(directory, ignore_errors=True)


class PrivatePgBouncer:
    """``pgbouncer`` in ``pool_mode`` in front of every database of the server ``target`` (a
    libpq ``host=... port=...``: the wildcard database ``*``), listening on a free loopback
    port; :attr:`url` names the database ``name`` through it."""

    def __init__(
        self, binary: str, directory: Path, run_as: RunAs, target: str, name: str, pool_mode: str
    ) -> None:
        self.directory, self.run_as = directory, run_as
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/{name}"
        self.log = directory / "pgbouncer.log"
        (directory / "users.txt").write_text('"postgres" ""\n')
        ini = directory / "pgbouncer.ini"
        ini.write_text(
            f"[databases]\n* = {target}\n\n[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {directory / 'users.txt'}\n"
            f"pool_mode = {pool_mode}\nmax_client_conn = 500\ndefault_pool_size = 10\n"
            f"logfile = {self.log}\npidfile = {directory / 'pgbouncer.pid'}\n"
            "server_reset_query =\nignore_startup_parameters = extra_float_digits\n"
        )
        for path in (directory / "users.txt", ini):
            run_as.own(path)
        self.process = run_as.start([binary, str(ini)], directory / "stdout.log")
        deadline = time.monotonic() + 60
        while not answers(self.url):
            if self.process.poll() is not None or time.monotonic() > deadline:
                log = self.log.read_text() if self.log.exists() else ""
                raise RuntimeError(f"pgbouncer did not start: {log[-2000:]}")
            time.sleep(0.1)

    def destroy(self) -> None:
        if self.process.poll() is None:
            # its own session: the runuser wrapper and pgbouncer under it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, 15)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, 9)
                self.process.wait(timeout=15)


@contextlib.contextmanager
def private_pgbouncer(
    target: str = "host=127.0.0.1 port=5432", name: str = "test", pool_mode: str = "transaction"
) -> Iterator[PrivatePgBouncer]:
    """A running :class:`PrivatePgBouncer`, stopped and removed at the end; skips without
    ``pgbouncer`` (Debian's package: ``apt-get install pgbouncer``)."""
    binary = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )
    if binary is None:
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    run_as = RunAs()
    directory = Path(tempfile.mkdtemp(prefix="csl-pgb-"))
    run_as.own(directory)
    bouncer: Optional[PrivatePgBouncer] = None
    try:
        bouncer = PrivatePgBouncer(binary, directory, run_as, target, name, pool_mode)
        yield bouncer
    finally:
        if bouncer is not None:
            bouncer.destroy()
        shutil.rmtree(directory, ignore_errors=True)
