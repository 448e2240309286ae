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
from celery_singleton_lock.testing import RedisServer, find_redis_server, free_port
from tests.celery.test_worker_start import EX_CONFIG, run_worker


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
        # Python 3.13 verifies strictly (VERIFY_X509_STRICT): a CA without key usage is refused
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
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
    # and a leaf without the key identifier of its issuer
    (tmp_path / "ext.cnf").write_text(
        "subjectAltName=IP:127.0.0.1\nauthorityKeyIdentifier=keyid,issuer\n"
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
    )
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


# -- a real worker, told the lock server's TLS wrongly --------------------------------------


@pytest.fixture
def broker() -> Iterator[RedisServer]:
    with RedisServer.running() as server:
        yield server


def tls_port(url: str) -> int:
    return int(url.split("://127.0.0.1:")[1].split("/")[0])


def test_worker_starts_on_a_verified_rediss_lock_url(
    tmp_path: Path, broker: RedisServer, tls_redis: str
) -> None:
    outcome = run_worker(
        tmp_path, broker, "solo", before=f"app.conf.singleton_lock_url = {tls_redis!r}"
    )
    assert outcome.said_ready, outcome.output


def test_redis_url_to_a_tls_only_port_refuses_the_start_saying_it_speaks_tls(
    tmp_path: Path, broker: RedisServer, tls_redis: str
) -> None:
    url = f"redis://127.0.0.1:{tls_port(tls_redis)}/0"
    outcome = run_worker(tmp_path, broker, "solo", before=f"app.conf.singleton_lock_url = {url!r}")
    assert outcome.returncode == EX_CONFIG, outcome.output
    assert f"lock server 127.0.0.1:{tls_port(tls_redis)} speaks TLS only" in outcome.output


def test_rediss_url_whose_certificate_does_not_verify_refuses_the_start(
    tmp_path: Path, broker: RedisServer, tls_redis: str
) -> None:
    url = f"rediss://127.0.0.1:{tls_port(tls_redis)}/0"  # no CA: the private one is unknown
    outcome = run_worker(tmp_path, broker, "solo", before=f"app.conf.singleton_lock_url = {url!r}")
    assert outcome.returncode == EX_CONFIG, outcome.output
    assert "TLS certificate not verified" in outcome.output
