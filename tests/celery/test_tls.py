"""A ``rediss://`` lock URL works: the plugin talks TLS to a real Redis with a private CA."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest
import redis
from celery import Celery

from celery_singleton_lock import LockedTask
from celery_singleton_lock.celery.config.lockers import forget_locker
from celery_singleton_lock.testing import find_redis_server, free_port


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(args, cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[str]:
    """A TLS-only redis-server; its URL with the CA to verify it."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    _run(
        "openssl",
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-subj",
        "/CN=test-ca",
        cwd=tmp_path,
    )
    _run(
        "openssl",
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
        cwd=tmp_path,
    )
    (tmp_path / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    _run(
        "openssl",
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "1",
        "-extfile",
        "ext.cnf",
        cwd=tmp_path,
    )
    port = free_port()
    process = subprocess.Popen(
        [
            find_redis_server(),
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--tls-cert-file",
            "server.crt",
            "--tls-key-file",
            "server.key",
            "--tls-ca-cert-file",
            "ca.crt",
            "--tls-auth-clients",
            "no",
            "--save",
            "",
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={tmp_path}/ca.crt"
    try:
        deadline = time.monotonic() + 10
        while True:
            if process.poll() is not None:
                pytest.skip("this redis-server was built without TLS support")
            try:
                redis.Redis.from_url(url, socket_connect_timeout=0.5).ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield url
    finally:
        process.kill()
        process.wait(timeout=10)


def test_a_rediss_lock_url_takes_and_releases_real_locks(tls_redis: str) -> None:
    app = Celery("tls", set_as_current=False, broker="memory://")
    app.conf.singleton_lock_url = tls_redis

    def job(account_id: int) -> int:
        return account_id

    task = app.task(name="tls.job", base=LockedTask, shared=False, lock_fencing=True)(job)
    try:
        assert task.apply(args=(7,)).get() == 7
        assert task.lock_locker.inspect.fence(task.lock_options.keyer.name((7,), {})) == 1
        assert list(task.lock_locker.inspect.scan()) == []  # released
    finally:
        forget_locker(app)
