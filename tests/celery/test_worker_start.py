"""What a real ``celery worker`` process does at start: it refuses an invalid lock
configuration, and it reports a lock server that may evict locks.

Refusal: each test writes a small app module to ``tmp_path`` and runs ``celery worker`` on it
until the process exits (or says "ready.", or a deadline passes). A refused worker exits
non-zero, its console output (stdout and stderr) names the setting or task, and it never
says "ready.". ``test_valid_configuration_starts`` shows the same harness does see "ready.".

Eviction: workers of ``tests.celery.lockapp`` against lock servers started with a given
``maxmemory-policy``; the line is read from the worker's log once it is ready.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

from celery_singleton_lock.celery.worker.start_checks import eviction_risk
from celery_singleton_lock.testing import RedisServer, free_port
from tests.celery.workers import ROOT, CeleryWorkerProcess, Servers, unique

#: Seconds a refused worker may take to exit (it imports Celery and the app, nothing more).
REFUSED_WITHIN = 45.0
#: Exit status of a refused worker (sysexits.h EX_CONFIG) when the check stopped it.
EX_CONFIG = 78
POOLS = ("prefork", "threads", "solo")

APP_MODULE = """\
import os

from celery import Celery

from celery_singleton_lock import LockedTask

app = Celery("startapp", broker=os.environ["CSL_BROKER_URL"])
app.conf.broker_connection_retry_on_startup = True
{before}

@app.task(base=LockedTask, name="billing.transfer", lock_on=("account_id",))
def transfer(account_id: int) -> None:
    return None

{after}
"""


@dataclass
class Outcome:
    returncode: int | None
    output: str

    @property
    def said_ready(self) -> bool:
        return " ready." in self.output


@pytest.fixture(scope="module")
def broker() -> Iterator[RedisServer]:
    with RedisServer.running() as server:
        yield server


def run_worker(
    tmp_path: Path, broker: RedisServer, pool: str, *, before: str = "", after: str = ""
) -> Outcome:
    """Run ``celery worker`` on an app configured by ``before`` (ahead of the task's
    definition) and ``after`` (behind it) until it exits, says "ready." or the deadline."""
    module = unique("startapp").replace("-", "_")
    (tmp_path / f"{module}.py").write_text(
        APP_MODULE.format(before=textwrap.dedent(before), after=textwrap.dedent(after))
    )
    log_path = tmp_path / f"{module}.log"
    env = {
        **os.environ,
        "CSL_BROKER_URL": broker.url,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
        "PYTHONUNBUFFERED": "1",
    }
    args = [sys.executable, "-m", "celery", "-A", module, "worker", "-P", pool, "-c", "2"]
    args += ["-Q", unique("q"), "--without-heartbeat", "--without-mingle", "--without-gossip"]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [*args, "-l", "INFO"],
            cwd=str(ROOT),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + REFUSED_WITHIN
            for _ in range(int(REFUSED_WITHIN / 0.05) + 1):
                if process.poll() is not None or " ready." in log_path.read_text(errors="replace"):
                    break
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            return Outcome(process.poll(), log_path.read_text(errors="replace"))
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


# -- refusal ----------------------------------------------------------------------------------


def test_valid_configuration_starts(tmp_path: Path, broker: RedisServer) -> None:
    outcome = run_worker(tmp_path, broker, "solo", before="app.conf.singleton_lock_ttl = 5")
    assert outcome.said_ready, outcome.output


@dataclass(frozen=True)
class Invalid:
    """An invalid configuration: app source ahead of / behind the task, words its error names."""

    before: str = ""
    after: str = ""
    words: tuple[str, ...] = ()
    #: stopped by the worker-start check (exit status EX_CONFIG); False: the task's own
    #: validation fails when the worker binds it (finalizes the app), with a traceback
    at_check: bool = True


INVALID = {
    "misspelt setting": Invalid(
        before="app.conf.singleton_lock_tll = 5",
        words=("singleton_lock_tll", "did you mean singleton_lock_ttl?"),
    ),
    "non-Redis lock URL": Invalid(
        before='app.conf.singleton_lock_url = "amqp://guest@localhost//"',
        words=("singleton_lock_url", "not a Redis URL"),
    ),
    "lock URL whose database is not a number": Invalid(
        before='app.conf.singleton_lock_url = "redis://127.0.0.1:6379/abc"',
        words=("singleton_lock_url", "database 'abc' is not a number"),
    ),
    # registered without being bound (Celery's registry binds nothing): the check sees it
    "misspelt option of a class-based task": Invalid(
        after=(
            "class Rebuild(LockedTask):\n"
            '    name = "billing.rebuild"\n'
            "    lock_tll = 5\n\n"
            "    def run(self, account_id: int) -> None:\n"
            "        return None\n\n"
            "app.tasks.register(Rebuild())"
        ),
        words=("task billing.rebuild", "lock_tll (did you mean lock_ttl?)"),
    ),
    "replica acknowledgement on a Redis Cluster": Invalid(
        before="app.conf.singleton_lock_cluster = True",
        after=(
            '@app.task(base=LockedTask, name="billing.replicated", lock_min_replicas=1)\n'
            "def replicated(account_id: int) -> None:\n"
            "    return None"
        ),
        words=("task billing.replicated", "lock_min_replicas=1", "Redis Cluster"),
    ),
    # each task alone is valid: only the two together, every task registered, are refused
    "tasks of one lock_group declaring different limits": Invalid(
        after=(
            '@app.task(base=LockedTask, name="billing.charge", lock_group="api", '
            'lock_on=("tenant",), lock_limit=2)\n'
            "def charge(tenant: str, amount: int) -> None:\n"
            "    return None\n\n"
            '@app.task(base=LockedTask, name="billing.refund", lock_group="api", '
            'lock_on=("tenant",), lock_limit=3)\n'
            "def refund(tenant: str, order: str) -> None:\n"
            "    return None"
        ),
        words=("lock_group 'api'", "billing.charge", "billing.refund", "different lock_limit"),
    ),
    # finalize(): the task is bound (its options validated) before the setting changes
    "option set after registration": Invalid(
        after="app.finalize()\napp.conf.singleton_lock_ttl = -1",
        words=("task billing.transfer", "lock_ttl=-1"),
    ),
    "prefix set after registration": Invalid(
        after='app.finalize()\napp.conf.singleton_lock_prefix = "locks{x}"',
        words=("task billing.transfer", "prefix 'locks{x}' is invalid"),
    ),
    # the usual order: the task is bound when the worker finalizes the app, and fails there
    "option set before the app is finalized": Invalid(
        after="app.conf.singleton_lock_ttl = -1",
        words=("task billing.transfer", "lock_ttl=-1"),
        at_check=False,
    ),
    "misspelt task option": Invalid(
        after=(
            '@app.task(base=LockedTask, name="billing.typo", lock_tll=5)\n'
            "def typo(account_id: int) -> None:\n"
            "    return None"
        ),
        words=("task billing.typo", "lock_tll (did you mean lock_ttl?)"),
        at_check=False,
    ),
    "bad prefix": Invalid(
        before='app.conf.singleton_lock_prefix = "has space"',
        words=("task billing.transfer", "prefix 'has space' is invalid"),
        at_check=False,
    ),
}
AT_CHECK = [case for case, invalid in INVALID.items() if invalid.at_check]


#: Refused workers run side by side: each is a ``celery worker`` process of its own that
#: imports Celery and the app and exits (about a second of one core's time, nothing shared
#: but the broker, each on a queue of its own), so two cores finish them in about half the time.
REFUSED_SIDE_BY_SIDE = 3


def refused_cases_collected(session: pytest.Session) -> list[tuple[str, str]]:
    """The (case, pool) of every collected test of this module that asks ``refused``."""
    wanted: dict[tuple[str, str], None] = {}
    for item in session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        asks = "refused" in getattr(item, "fixturenames", ())
        if item.module is sys.modules[__name__] and asks and params.get("case") in INVALID:
            wanted[params["case"], params.get("pool", "solo")] = None
    return list(wanted)


@pytest.fixture(scope="module")
def refused(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    broker: RedisServer,
) -> Iterator[Callable[[str, str], Outcome]]:
    """``refused(case, pool)``: the outcome of a worker on ``INVALID[case]``; each runs once.
    Every one the collected tests ask for is started at the first ask, side by side."""
    futures: dict[tuple[str, str], Future[Outcome]] = {}
    with ThreadPoolExecutor(REFUSED_SIDE_BY_SIDE, thread_name_prefix="refused") as pool_of:

        def submit(case: str, pool: str) -> None:
            invalid = INVALID[case]
            futures[case, pool] = pool_of.submit(
                run_worker,
                tmp_path_factory.mktemp("refused"),  # here: mktemp is not for threads
                broker,
                pool,
                before=invalid.before,
                after=invalid.after,
            )

        def outcome(case: str, pool: str) -> Outcome:
            if not futures:
                for wanted in refused_cases_collected(request.session):
                    submit(*wanted)
            if (case, pool) not in futures:
                submit(case, pool)
            return futures[case, pool].result(timeout=REFUSED_WITHIN * 2)

        yield outcome


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("case", INVALID)
def test_invalid_configuration_stops_the_worker(
    refused: Callable[[str, str], Outcome], case: str, pool: str
) -> None:
    outcome = refused(case, pool)
    assert outcome.returncode not in (None, 0), f"worker did not refuse:\n{outcome.output}"
    assert not outcome.said_ready, outcome.output
    for word in INVALID[case].words:
        assert word in outcome.output, f"{word!r} not in:\n{outcome.output}"


@pytest.mark.parametrize("case", AT_CHECK)
def test_worker_refused_by_the_check_exits_with_ex_config(
    refused: Callable[[str, str], Outcome], case: str
) -> None:
    outcome = refused(case, "solo")
    assert outcome.returncode == EX_CONFIG, outcome.output


@pytest.mark.parametrize("case", AT_CHECK)
def test_worker_refused_by_the_check_says_why_in_one_critical_line(
    refused: Callable[[str, str], Outcome], case: str
) -> None:
    invalid, outcome = INVALID[case], refused(case, "solo")
    lines = [line for line in outcome.output.splitlines() if invalid.words[0] in line]
    assert len(lines) == 1, outcome.output
    assert "CRITICAL" in lines[0] and "worker not started" in lines[0]
    assert all(word in lines[0] for word in invalid.words)
    assert "Traceback" not in outcome.output


# -- the lock server's Redis version ---------------------------------------------------------

#: The worker's redis-py reads the real server's INFO, then the version a Redis 6.0 reports
#: (redis-server here is 7.0: an old one cannot be had)
OLD_REDIS = """
import redis

_info = redis.Redis.info


def _info_of_redis_6_0(self, section=None, *args, **kwargs):
    reply = _info(self, section, *args, **kwargs)
    if "redis_version" in reply:
        reply["redis_version"] = "6.0.16"
    return reply


redis.Redis.info = _info_of_redis_6_0
"""
REPLACE_TASK = """
@app.task(base=LockedTask, name="billing.latest_balance", on_duplicate="replace")
def latest_balance(account_id: int) -> None:
    return None
"""


def test_replace_on_a_lock_server_older_than_redis_6_2_refuses_the_start(
    tmp_path: Path, broker: RedisServer
) -> None:
    outcome = run_worker(tmp_path, broker, "solo", before=OLD_REDIS, after=REPLACE_TASK)
    assert outcome.returncode == EX_CONFIG and not outcome.said_ready, outcome.output
    [line] = [line for line in outcome.output.splitlines() if "worker not started" in line]
    assert "CRITICAL" in line
    assert "task billing.latest_balance: on_duplicate='replace' needs Redis >= 6.2" in line
    assert f"lock server 127.0.0.1:{broker.port} runs Redis 6.0.16" in line
    assert "Traceback" not in outcome.output


def test_a_lock_server_older_than_redis_6_2_starts_a_worker_without_replace(
    tmp_path: Path, broker: RedisServer
) -> None:
    outcome = run_worker(tmp_path, broker, "solo", before=OLD_REDIS)
    assert outcome.said_ready, outcome.output


def test_replace_on_the_real_redis_7_starts(tmp_path: Path, broker: RedisServer) -> None:
    outcome = run_worker(tmp_path, broker, "solo", after=REPLACE_TASK)
    assert outcome.said_ready, outcome.output


# -- eviction ---------------------------------------------------------------------------------


@dataclass
class LockUrlServers(Servers):
    """Servers whose workers reach the lock server through ``lock_url`` (an ACL user...)."""

    lock_url: str = ""

    def env(self, queue: str, **extra: str) -> dict[str, str]:
        return super().env(queue, **{"CSL_LOCK_URL": self.lock_url or self.lock.url, **extra})


def started_worker_log(broker: RedisServer, lock: RedisServer, lock_url: str = "") -> str:
    """The log of a lockapp worker (solo pool) against ``lock``, once it is ready."""
    servers = LockUrlServers(
        broker_url=broker.url,
        lock=lock,
        lock_url=lock_url,
    )
    with CeleryWorkerProcess(servers, queue=unique("q"), pool="solo") as worker:
        return worker.log()


def lines_with(log: str, text: str) -> list[str]:
    return [line for line in log.splitlines() if text in line]


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-random"])
def test_allkeys_policy_is_logged_as_an_error(broker: RedisServer, policy: str) -> None:
    with RedisServer.running(extra_args=["--maxmemory-policy", policy]) as lock:
        log = started_worker_log(broker, lock)
    lines = lines_with(log, f"maxmemory-policy is {policy}")
    assert len(lines) == 1 and "ERROR/MainProcess" in lines[0], log
    assert "fence counter" in lines[0] and "noeviction" in lines[0]


def test_volatile_policy_is_logged_as_a_warning(broker: RedisServer) -> None:
    with RedisServer.running(extra_args=["--maxmemory-policy", "volatile-ttl"]) as lock:
        log = started_worker_log(broker, lock)
    lines = lines_with(log, "maxmemory-policy is volatile-ttl")
    assert len(lines) == 1 and "WARNING/MainProcess" in lines[0], log


def test_noeviction_policy_logs_nothing_about_eviction(broker: RedisServer) -> None:
    with RedisServer.running(extra_args=["--maxmemory-policy", "noeviction"]) as lock:
        log = started_worker_log(broker, lock)
    assert lines_with(log, "maxmemory-policy") == [], log
    assert lines_with(log, "singleton locks on"), log


def test_user_without_config_permission_is_told_it_could_not_be_checked(
    broker: RedisServer,
) -> None:
    with RedisServer.running(extra_args=["--maxmemory-policy", "allkeys-lru"]) as lock:
        admin = lock.client()
        admin.acl_setuser(
            "locks", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
            commands=["+@all", "-config"],
        )  # fmt: skip
        admin.close()
        log = started_worker_log(broker, lock, f"redis://locks:pw@127.0.0.1:{lock.port}/0")
    lines = lines_with(log, "could not check the lock server's maxmemory-policy")
    assert len(lines) == 1 and "WARNING/MainProcess" in lines[0], log
    assert "NoPermissionError" in lines[0]


def test_unreachable_lock_server_is_named_once_not_again_by_the_eviction_check(
    broker: RedisServer,
) -> None:
    # the start check has named it (tests/celery/test_lock_server_at_start.py)
    port = free_port()
    with RedisServer.running() as lock:
        log = started_worker_log(broker, lock, f"redis://127.0.0.1:{port}/0")
    assert len(lines_with(log, f"lock server 127.0.0.1:{port} refused the connection")) == 1, log
    assert lines_with(log, "could not check the lock server's maxmemory-policy") == [], log


# -- which policies are safe (pure function) --------------------------------------------------


def test_noeviction_is_the_only_safe_policy() -> None:
    assert eviction_risk("noeviction") is None


@pytest.mark.parametrize("policy", ["volatile-lru", "volatile-lfu", "volatile-random"])
def test_volatile_policies_warn_that_locks_not_fences_can_be_evicted(policy: str) -> None:
    level, message = eviction_risk(policy) or (0, "")
    assert level == logging.WARNING
    assert "lock keys have one" in message and "fence counters have no TTL" in message


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu"])
def test_allkeys_policies_say_fences_can_go_backwards(policy: str) -> None:
    level, message = eviction_risk(policy) or (0, "")
    assert level == logging.ERROR and "fences go backwards" in message


def test_an_unknown_policy_is_a_warning() -> None:
    assert (eviction_risk("lazy-evict") or (0, ""))[0] == logging.WARNING
