"""Installed is not used: a real ``celery worker`` of an app with no ``LockedTask`` is left alone.

The app (tests/celery/plainapp.py) carries every celery-singleton setting and a misspelt
setting of ours (which the start check would refuse), uses celery-singleton's own
``Singleton``, and names a lock server of ours (a throwaway server of
its own per worker). One worker per pool runs once (module fixture ``run``): it starts, runs a
plain task and a celery-singleton task sent twice, and stops warm; the tests read what it
did: its exit, its report (threads, bootsteps), this package's log records, and the lock
server's count of connections received.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest
import redis

from celery_singleton_lock.testing import RedisServer
from tests.celery import plainapp
from tests.celery.workers import STOP_TIMEOUT, CeleryWorkerProcess, Servers, unique

POOLS = ("prefork", "solo")
#: seconds a result may take (the worker is ready; the body waits for its gate only)
RESULT_TIMEOUT = 30


@dataclass
class PlainServers(Servers):
    """Servers of plainapp's workers: celery-singleton's locks on the broker's server."""

    singleton_url: str = ""
    report: str = ""

    def env(self, queue: str, **extra: str) -> dict[str, str]:
        return super().env(
            queue, CSL_SINGLETON_URL=self.singleton_url, CSL_REPORT=self.report, **extra
        )


@dataclass
class Run:
    """What one worker of plainapp did."""

    said_ready: bool
    exit_code: int | None
    log: str
    report: dict[str, object]
    our_log: str
    plain_result: object
    first_id: str
    duplicate_id: str
    singleton_result: object
    #: connections the lock server received while the worker lived
    lock_server_connections: int


def connections_received(client: redis.Redis) -> int:
    return int(client.info("stats")["total_connections_received"])


def run_plain_worker(broker: RedisServer, pool: str, report: Path) -> Run:
    with RedisServer.running() as lock:
        servers = PlainServers(
            broker_url=broker.url,
            lock=lock,
            app="tests.celery.plainapp",
            singleton_url=broker.url.replace("/0", "/2"),
            report=str(report),
        )
        queue = unique("q")
        plainapp.configure(
            broker_url=servers.broker_url,
            backend_url=servers.backend_url,
            lock_url=lock.url,
            singleton_url=servers.singleton_url,
            queue=queue,
        )
        worker = CeleryWorkerProcess(servers, queue=queue, pool=pool)
        inspector = lock.client()
        before = connections_received(inspector)
        try:
            worker.start()
            plain = plainapp.add.delay(2, 3).get(timeout=RESULT_TIMEOUT)
            gate = f"gate:{uuid.uuid4().hex}"
            first = plainapp.gated_add.delay(4, 5, gate)
            duplicate = plainapp.gated_add.delay(4, 5, gate)
            opener = redis.Redis.from_url(broker.url)
            opener.rpush(gate, "go")
            opener.close()
            singleton_result = first.get(timeout=RESULT_TIMEOUT)
            exit_code = worker.stop(STOP_TIMEOUT)
        finally:
            worker._cleanup()
        after = connections_received(inspector)  # the same connection: it counts once
        inspector.close()
        return Run(
            said_ready=" ready." in worker.log(),
            exit_code=exit_code,
            log=worker.log(),
            report=json.loads(report.read_text()) if report.exists() else {},
            our_log=Path(f"{report}.ours.log").read_text(),
            plain_result=plain,
            first_id=first.id,
            duplicate_id=duplicate.id,
            singleton_result=singleton_result,
            lock_server_connections=after - before,
        )


@pytest.fixture(scope="module")
def broker() -> Iterator[RedisServer]:
    with RedisServer.running() as server:
        yield server


@pytest.fixture(scope="module")
def run(
    tmp_path_factory: pytest.TempPathFactory, broker: RedisServer
) -> Iterator[Callable[[str], Run]]:
    """``run(pool)``: what plainapp's worker on that pool did; each pool runs once."""
    runs: dict[str, Run] = {}

    def outcome(pool: str) -> Run:
        if pool not in runs:
            report = tmp_path_factory.mktemp("plain") / "report.json"
            runs[pool] = run_plain_worker(broker, pool, report)
        return runs[pool]

    yield outcome
    plainapp.app.close()


@pytest.mark.parametrize("pool", POOLS)
def test_our_receivers_are_connected_in_the_plain_worker(
    run: Callable[[str], Run], pool: str
) -> None:
    # the condition the other tests are about: the app imports the Celery layer
    assert run(pool).report.get("ours_imported") is True, run(pool).log


@pytest.mark.parametrize("pool", POOLS)
def test_plain_app_with_celery_singleton_settings_starts_and_stops_cleanly(
    run: Callable[[str], Run], pool: str
) -> None:
    outcome = run(pool)
    assert outcome.said_ready and outcome.exit_code == 0, outcome.log


@pytest.mark.parametrize("pool", POOLS)
def test_plain_app_runs_its_tasks(run: Callable[[str], Run], pool: str) -> None:
    assert run(pool).plain_result == 5


@pytest.mark.parametrize("pool", POOLS)
def test_celery_singleton_deduplicates_beside_this_package(
    run: Callable[[str], Run], pool: str
) -> None:
    outcome = run(pool)
    assert outcome.duplicate_id == outcome.first_id
    assert outcome.singleton_result == 9


@pytest.mark.parametrize("pool", POOLS)
def test_plain_app_gets_no_bootstep_of_ours(run: Callable[[str], Run], pool: str) -> None:
    steps = run(pool).report.get("steps")
    assert isinstance(steps, list) and steps, run(pool).log
    assert [step for step in steps if "celery_singleton_lock" in step] == []


@pytest.mark.parametrize("pool", POOLS)
def test_plain_app_gets_no_thread_of_ours(run: Callable[[str], Run], pool: str) -> None:
    threads = run(pool).report.get("threads")
    assert isinstance(threads, list) and threads, run(pool).log
    assert [name for name in threads if name.startswith("celery-singleton-lock")] == []


@pytest.mark.parametrize("pool", POOLS)
def test_plain_app_gets_no_log_line_of_ours(run: Callable[[str], Run], pool: str) -> None:
    assert run(pool).our_log == ""


@pytest.mark.parametrize("pool", POOLS)
def test_plain_app_worker_never_connects_to_the_lock_server_it_names(
    run: Callable[[str], Run], pool: str
) -> None:
    assert run(pool).lock_server_connections == 0
