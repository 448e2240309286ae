"""Locks under real ``celery worker`` processes: every pool, every way a child dies, contention,
redelivery, and RabbitMQ as the broker.

Each scenario starts its own workers (tests/celery/workers.py) on a queue of its own, against
Redis servers of this module only, so killing workers never disturbs another test. Bodies
record themselves in the lock Redis (see ``body`` in tests/celery/tasks/core.py):
``runs:<key>``, ``overlaps:<key>``.
A scenario that several facts are read from runs once, in a module-scoped fixture, and each
fact is a test of its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from importlib.util import find_spec
from typing import Any, Iterator, Optional

import pytest
import redis
from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded, WorkerLostError
from celery.result import AsyncResult
from kombu import Connection

from celery_singleton_lock import DuplicateTaskSkipped
from celery_singleton_lock.testing import RedisServer
from tests.celery.tasks import exits, expiry, policies
from tests.celery.workers import (
    CeleryWorkerProcess,
    Servers,
    WorkerGroup,
    client_app,
    close_client,
    lock_key,
    unique,
    worker_group,
)
from tests.conftest import rabbitmq_available
from tests.support import SideBySide, side_by_side, sleep_for, wait_until

RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672//"

#: Seconds the worker's main process may take to free a dead child's lock once Celery has
#: reported the death (the lock's own TTL is 30 s: only a reclaim frees it this soon).
RECLAIM_WITHIN = 3.0
#: Seconds Celery's prefork pool may take to report a SIGKILLed child: it sometimes notices
#: only at its maintain_pool timer, which runs every 5 s.
CELERY_NOTICES_DEAD_CHILD_WITHIN = 6.0
#: The renewal scenario: short_ttl's body runs over two of its TTLs; the duplicate is sent
#: half a second past the first TTL, two seconds before the body ends (time to be delivered).
RENEWED_BODY_S = 2.25 * expiry.SHORT_TTL
DUPLICATE_AFTER_S = expiry.SHORT_TTL + 0.5


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    """Broker and lock servers of this module only (results: broker db 1)."""
    with RedisServer.running() as broker, RedisServer.running() as lock:
        yield Servers(broker_url=broker.url, lock=lock)


@pytest.fixture(scope="module")
def client(servers: Servers) -> Iterator[Celery]:
    app = client_app(servers)
    yield app
    close_client(app)


@pytest.fixture(scope="module")
def lock_store(servers: Servers) -> Iterator[redis.Redis]:
    connection = servers.lock.client(socket_timeout=5)
    yield connection
    connection.close()


@pytest.fixture
def workers(servers: Servers) -> Iterator[WorkerGroup]:
    with worker_group(servers) as group:
        yield group


@pytest.fixture
def key() -> str:
    return unique("k")


# -- helpers ----------------------------------------------------------------------------------


def send(client: Celery, queue: str, task: Any, *args: Any) -> AsyncResult:
    return client.send_task(task.name, args=args, queue=queue)


@dataclass
class Run:
    task_id: str
    pid: int
    started: float  # time.time() in the worker


def runs(store: redis.Redis, key: str) -> list[Run]:
    parsed = []
    for raw in store.lrange(f"runs:{key}", 0, -1):
        task_id, pid, started = raw.decode().split("|")
        parsed.append(Run(task_id, int(pid), float(started)))
    return parsed


def overlaps(store: redis.Redis, key: str) -> int:
    return int(store.get(f"overlaps:{key}") or 0)


def first_run(store: redis.Redis, key: str, timeout: float = 15.0) -> Run:
    """Wait for the first body of ``key`` to start."""
    wait_until(lambda: store.llen(f"runs:{key}") >= 1, timeout=timeout)
    return runs(store, key)[0]


def wait_gone(store: redis.Redis, name: str, timeout: float) -> float:
    """Seconds until the key ``name`` no longer exists; fails after ``timeout``."""
    started = time.monotonic()
    wait_until(lambda: store.exists(name) == 0, timeout=timeout, interval=0.01)
    return time.monotonic() - started


# -- 1. renewal on each pool ------------------------------------------------------------------


@dataclass
class RenewalScenario:
    first_id: str
    duplicate_error: Optional[BaseException]
    pttls_while_inside: list[int]
    observed_for: float  # seconds from the body seen started to the last sample
    runs: list[Run]
    overlaps: int


RENEWAL_POOLS = ["prefork", "threads", "solo", "gevent"]


@pytest.fixture(scope="module")
def renewal_workers(servers: Servers) -> Iterator[dict[str, list[CeleryWorkerProcess]]]:
    """The workers of the renewal scenarios, every pool's launched at once (a worker's start
    is mostly import time, which two cores overlap); each pool's serve one scenario, which
    stops them."""
    pools = [pool for pool in RENEWAL_POOLS if pool != "gevent" or find_spec("gevent")]
    with worker_group(servers) as group:
        # a solo worker runs one task at a time: the duplicate needs a second worker
        launched = {
            pool: group.launch(2 if pool == "solo" else 1, pool=pool, concurrency=2)
            for pool in pools
        }
        group.wait_ready()
        yield launched


@pytest.fixture(scope="module", params=RENEWAL_POOLS)
def renewal(
    request: pytest.FixtureRequest,
    renewal_workers: dict[str, list[CeleryWorkerProcess]],
    client: Celery,
    lock_store: redis.Redis,
) -> RenewalScenario:
    """short_ttl (lock_ttl=SHORT_TTL, skip) runs RENEWED_BODY_S; a duplicate is sent
    DUPLICATE_AFTER_S into the body.

    While the body is inside (gauge == 1), the lock's PTTL is sampled in the same MULTI as
    the gauge, so every sample is known to be taken while the body ran.
    """
    pool = request.param
    if pool not in renewal_workers:
        pytest.skip("gevent is not installed")
    store, key = lock_store, unique("renew")
    name = lock_key(expiry.short_ttl, key)
    queue = renewal_workers[pool][0].queue
    first = send(client, queue, expiry.short_ttl, key, RENEWED_BODY_S)
    first_run(store, key)
    inside_since = time.monotonic()
    duplicate: Optional[AsyncResult] = None
    pttls: list[int] = []
    last_sample = inside_since
    for _ in range(1000):  # ~20 ms apart: bounded well past the 4.5 s body
        gauge, pttl = store.pipeline(transaction=True).get(f"gauge:{key}").pttl(name).execute()
        if int(gauge or 0) == 0:
            break
        pttls.append(int(pttl))
        last_sample = time.monotonic()
        if duplicate is None and time.monotonic() - inside_since >= DUPLICATE_AFTER_S:
            duplicate = send(client, queue, expiry.short_ttl, key, 0)
        time.sleep(0.02)
    first.get(timeout=15)
    error: Optional[BaseException] = None
    if duplicate is not None:
        try:
            duplicate.get(timeout=15)
        except DuplicateTaskSkipped as exc:
            error = exc
    for worker in renewal_workers[pool]:
        worker.stop()
    return RenewalScenario(
        first.id, error, pttls, last_sample - inside_since, runs(store, key), overlaps(store, key)
    )


def test_lock_key_exists_with_at_most_its_ttl_throughout_a_body_longer_than_the_ttl(
    renewal: RenewalScenario,
) -> None:
    samples = renewal.pttls_while_inside
    # past its first TTL (the key was set before the body started): unrenewed, it was gone
    assert renewal.observed_for > 1.25 * expiry.SHORT_TTL, "the body was not observed long enough"
    assert min(samples) > 0, f"lock key missing (or without TTL) while the body ran: {samples}"
    ttl_ms = expiry.SHORT_TTL * 1000
    assert max(samples) <= ttl_ms, f"TTL above lock_ttl={expiry.SHORT_TTL}s: {max(samples)} ms"


def test_duplicate_sent_past_the_ttl_is_skipped_naming_the_running_task(
    renewal: RenewalScenario,
) -> None:
    assert isinstance(renewal.duplicate_error, DuplicateTaskSkipped), renewal.duplicate_error
    assert renewal.first_id in str(renewal.duplicate_error)
    assert [run.task_id for run in renewal.runs] == [renewal.first_id]
    assert renewal.overlaps == 0


# -- 2. prefork exit paths --------------------------------------------------------------------


@pytest.fixture(scope="module")
def prefork(servers: Servers) -> Iterator[CeleryWorkerProcess]:
    """One prefork worker (2 children) shared by the exit-path tests (each uses its own key)."""
    with worker_group(servers) as group:
        (worker,) = group.start(1, pool="prefork", concurrency=2)
        yield worker


def test_soft_time_limit_releases_the_lock(
    prefork: CeleryWorkerProcess, client: Celery, lock_store: redis.Redis, key: str
) -> None:
    name = lock_key(exits.soft_limited, key)
    result = send(client, prefork.queue, exits.soft_limited, key)
    wait_until(lambda: lock_store.exists(name), timeout=10, interval=0.01)  # 0.5 s window
    with pytest.raises(SoftTimeLimitExceeded):
        result.get(timeout=15)
    # released by the child's releaser thread, a moment after the failure is stored (a loaded
    # machine has taken over 2 s); only a release frees it before its TTL (15 s, the default)
    wait_until(lambda: not lock_store.exists(name), timeout=10, interval=0.01)


def test_hard_time_limit_lock_is_freed_by_the_main_process_long_before_its_ttl(
    prefork: CeleryWorkerProcess, client: Celery, lock_store: redis.Redis, key: str
) -> None:
    name = lock_key(exits.hard_limited, key)  # time_limit=1, lock_ttl=30
    result = send(client, prefork.queue, exits.hard_limited, key)
    first_run(lock_store, key)
    with pytest.raises(TimeLimitExceeded):
        result.get(timeout=15)
    took = wait_gone(lock_store, name, RECLAIM_WITHIN)
    print(f"hard time limit: lock freed {took:.2f}s after the failure was stored")


def test_revoke_terminate_lock_is_freed_by_the_main_process(
    prefork: CeleryWorkerProcess, client: Celery, lock_store: redis.Redis, key: str
) -> None:
    name = lock_key(exits.long_running, key, 20)  # lock_ttl=30
    result = send(client, prefork.queue, exits.long_running, key, 20)
    first_run(lock_store, key)
    assert lock_store.pttl(name) > 25_000
    client.control.revoke(result.id, terminate=True)
    took = wait_gone(lock_store, name, RECLAIM_WITHIN)
    print(f"revoke(terminate=True): lock freed {took:.2f}s after the revoke")
    wait_until(lambda: result.state == "REVOKED", timeout=10)


def kill_child_running_the_task(
    worker: CeleryWorkerProcess, client: Celery, store: redis.Redis, key: str
) -> tuple[float, float]:
    """SIGKILL the pool child running long_running (lock_ttl=30); returns (seconds until
    Celery reported WorkerLostError, seconds from then until the lock was gone)."""
    name = lock_key(exits.long_running, key, 20)
    result = send(client, worker.queue, exits.long_running, key, 20)
    run = first_run(store, key)
    assert run.pid in worker.children()
    os.kill(run.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    with pytest.raises(WorkerLostError):
        result.get(timeout=CELERY_NOTICES_DEAD_CHILD_WITHIN + 5)
    reported = time.monotonic() - killed_at
    took = wait_gone(store, name, RECLAIM_WITHIN)
    print(
        f"SIGKILL of the child: WorkerLostError {reported:.2f}s after the kill, lock freed "
        f"{took:.2f}s after that"
    )
    return reported, took


def test_sigkill_of_the_pool_child_lock_is_freed_by_the_main_process(
    prefork: CeleryWorkerProcess, client: Celery, lock_store: redis.Redis, key: str
) -> None:
    reported, took = kill_child_running_the_task(prefork, client, lock_store, key)
    assert took < RECLAIM_WITHIN
    assert reported + took < CELERY_NOTICES_DEAD_CHILD_WITHIN + RECLAIM_WITHIN


@dataclass
class WholeWorkerKill:
    ttl_at_kill_ms: int
    gone_after: Optional[float] = None  # seconds from the kill until the key was gone
    duplicate_started_after: Optional[float] = None  # seconds from the kill to its body


def kill_whole_worker(
    workers: WorkerGroup, client: Celery, store: redis.Redis, key: str, *, duplicate: bool
) -> WholeWorkerKill:
    """long_short_ttl (lock_ttl=2, retry) runs on a worker that is then killed -9, main and
    children; with ``duplicate``, a duplicate goes to a second worker right after the kill."""
    (holder,) = workers.launch(1, pool="prefork", concurrency=1)
    other = workers.launch(1, pool="prefork", concurrency=1)[0] if duplicate else None
    workers.wait_ready()
    name = lock_key(expiry.long_short_ttl, key)
    send(client, holder.queue, expiry.long_short_ttl, key, 30)
    first_run(store, key)
    holder.kill_group(signal.SIGKILL)
    killed_at, killed_wall = time.monotonic(), time.time()
    outcome = WholeWorkerKill(ttl_at_kill_ms=int(store.pttl(name)))
    if other is None:
        wait_gone(store, name, 2.0 + 1.0)
        outcome.gone_after = time.monotonic() - killed_at
        return outcome
    second = send(client, other.queue, expiry.long_short_ttl, key, 0)
    second.get(timeout=15)
    (run,) = (run for run in runs(store, key) if run.task_id == second.id)
    outcome.duplicate_started_after = run.started - killed_wall
    return outcome


def test_kill_9_of_the_whole_worker_lock_expires_by_itself_within_its_ttl(
    workers: WorkerGroup, client: Celery, lock_store: redis.Redis, key: str
) -> None:
    outcome = kill_whole_worker(workers, client, lock_store, key, duplicate=False)
    print(f"kill -9 of the worker: key gone {outcome.gone_after:.2f}s after the kill")
    assert 0 < outcome.ttl_at_kill_ms <= 2000
    assert outcome.gone_after is not None and outcome.gone_after <= 2.0 + 1.0


def test_kill_9_of_the_whole_worker_duplicate_on_another_worker_runs_within_the_ttl(
    workers: WorkerGroup, client: Celery, lock_store: redis.Redis, key: str
) -> None:
    outcome = kill_whole_worker(workers, client, lock_store, key, duplicate=True)
    print(f"kill -9 of the worker: duplicate ran {outcome.duplicate_started_after:.2f}s after")
    assert outcome.duplicate_started_after is not None
    assert outcome.duplicate_started_after <= 2.0 + 3.0


# -- 3. contention ----------------------------------------------------------------------------


@dataclass
class Contention:
    sent: list[str]
    runs: list[Run]
    overlaps: int
    lock_left: bool
    duration: float
    states: dict[str, int] = field(default_factory=dict)
    lock_retries: int = 0  # times a task found the lock held and was sent again
    #: task id -> state, for the ids that did not end in SUCCESS
    not_succeeded: dict[str, str] = field(default_factory=dict)

    def misruns(self) -> dict[str, list[str]]:
        """Ids whose body ran more than once, and ids whose body never ran (should be empty)."""
        counts = Counter(run.task_id for run in self.runs)
        return {
            "ran more than once": sorted(task_id for task_id, n in counts.items() if n > 1),
            "never ran": sorted(set(self.sent) - set(counts)),
        }


def all_ran(store: redis.Redis, key: str, task_ids: list[str]) -> bool:
    return {run.task_id for run in runs(store, key)} >= set(task_ids)


def contend(
    servers: Servers,
    client: Celery,
    tasks: int,
    *,
    queue: Optional[str] = None,
    budget: float = 150.0,
) -> Contention:
    """``tasks`` same-key hold_retry tasks (body 5 ms) over 2 prefork workers x 4."""
    key = unique("contended")
    store = servers.lock.client(socket_timeout=5)
    try:
        with worker_group(servers) as group:
            started = group.start(2, pool="prefork", concurrency=4, queue=queue)
            queue = started[0].queue
            began = time.monotonic()
            sent = [send(client, queue, policies.hold_retry, key, 0.005).id for _ in range(tasks)]
            for _ in range(int(budget / 0.1) + 1):
                # every id has run (a body that ran twice does not make up for one not yet run)
                if store.llen(f"runs:{key}") >= tasks and all_ran(store, key, sent):
                    break
                if time.monotonic() - began > budget:
                    break
                time.sleep(0.1)
            done = len({run.task_id for run in runs(store, key)})
            if done < tasks:
                pytest.fail(f"contention: only {done} of {tasks} tasks ran within {budget:.0f}s")
            duration = time.monotonic() - began
            state_of: dict[str, str] = {}
            for _ in range(100):
                state_of = {task_id: AsyncResult(task_id, app=client).state for task_id in sent}
                if all(state == "SUCCESS" for state in state_of.values()):
                    break
                time.sleep(0.2)
            states = dict(Counter(state_of.values()))
            return Contention(
                sent=sent,
                runs=runs(store, key),
                overlaps=overlaps(store, key),
                lock_left=not _released_within(store, lock_key(policies.hold_retry, key), 2.0),
                duration=duration,
                states=states,
                lock_retries=sum(w.count_in_log("; lock retry ") for w in started),
                not_succeeded={i: state for i, state in state_of.items() if state != "SUCCESS"},
            )
    finally:
        store.close()


@pytest.fixture(scope="module")
def contention(servers: Servers, client: Celery) -> Contention:
    outcome = contend(servers, client, 300)
    print(
        f"contention (Redis broker): 300 same-key tasks ran in {outcome.duration:.1f}s after "
        f"{outcome.lock_retries} lock retries; {outcome.states}"
    )
    return outcome


def test_contention_every_task_runs_exactly_once(contention: Contention) -> None:
    assert contention.misruns() == {"ran more than once": [], "never ran": []}


def test_contention_every_task_ends_in_success(contention: Contention) -> None:
    assert contention.not_succeeded == {}


def test_contention_bodies_never_overlap(contention: Contention) -> None:
    assert contention.overlaps == 0


def test_contention_leaves_no_lock_behind(contention: Contention) -> None:
    assert not contention.lock_left


# -- 4. a body five times longer than the TTL, with a duplicate -------------------------------


def long_body_with_duplicate(
    workers: WorkerGroup,
    client: Celery,
    store: redis.Redis,
    key: str,
    queue: Optional[str] = None,
) -> list[Run]:
    """short_ttl_retry (lock_ttl=1, retry) runs 5 s on 2 prefork workers x 2; a duplicate is
    sent 2 s into the body. Returns the runs once both have ended."""
    started = workers.start(2, pool="prefork", concurrency=2, queue=queue)
    queue = started[0].queue
    first = send(client, queue, expiry.short_ttl_retry, key, 5)
    run = first_run(store, key)
    sleep_for(run.started + 2 - time.time(), step=0.1)
    duplicate = send(client, queue, expiry.short_ttl_retry, key, 0.5)
    first.get(timeout=15)
    duplicate.get(timeout=15)
    return runs(store, key)


def test_long_body_with_a_short_ttl_never_runs_alongside_its_duplicate(
    workers: WorkerGroup, client: Celery, lock_store: redis.Redis, key: str
) -> None:
    ran = long_body_with_duplicate(workers, client, lock_store, key)
    assert len(ran) == 2
    assert overlaps(lock_store, key) == 0
    assert ran[1].started >= ran[0].started + 5 - 0.05  # the duplicate waited for the release


# -- 5. redelivery (acks_late, visibility timeout shorter than the body) ----------------------


@dataclass
class Attempt:
    task_id: str
    pid: int
    at: float
    redelivered: bool
    lock_retries: int


def attempts(store: redis.Redis, key: str) -> list[Attempt]:
    parsed = []
    for raw in store.lrange(f"attempts:{key}", 0, -1):
        task_id, pid, at, redelivered, retries = raw.decode().split("|")
        parsed.append(Attempt(task_id, int(pid), float(at), redelivered == "1", int(retries)))
    return parsed


def _released_within(store: redis.Redis, name: str, seconds: float) -> bool:
    """The last release runs in a worker's releaser thread, just after its result is stored."""
    try:
        wait_gone(store, name, seconds)
    except AssertionError:
        return False
    return True


@dataclass
class Redelivery:
    task_id: str
    runs: list[Run]
    attempts: list[Attempt]
    overlaps: int
    final_state: str

    def summary(self) -> str:
        redelivered = sum(a.redelivered for a in self.attempts)
        retried = sum(a.lock_retries > 0 for a in self.attempts)
        return (
            f"{len(self.attempts)} deliveries reached before_start ({redelivered} restored by "
            f"the visibility timeout, {retried} lock retries), {len(self.runs)} body run(s), "
            f"{self.overlaps} overlaps"
        )


@pytest.fixture(scope="module")
def redelivery_broker(servers: Servers) -> Iterator[Servers]:
    """A broker of its own, whose workers restore unacked messages after 2 s."""
    with RedisServer.running() as broker:
        yield Servers(
            broker_url=broker.url,
            lock=servers.lock,
            visibility_timeout=2,
        )


def run_redelivery(servers: Servers, task: Any, seconds: float, watch: float) -> Redelivery:
    """``task`` (acks_late, lock_ttl=2) runs ``seconds`` on 2 prefork workers x 2 whose broker
    hands unacked messages out again after 2 s; everything is watched for ``watch`` seconds,
    then the workers are killed."""
    key = unique("redeliver")
    store = servers.lock.client(socket_timeout=5)
    client = client_app(servers)
    try:
        with worker_group(servers) as group:
            (worker, _) = group.start(2, pool="prefork", concurrency=2)
            result = send(client, worker.queue, task, key, seconds)
            began = time.monotonic()
            first_run(store, key)
            sleep_for(watch - (time.monotonic() - began), step=0.1)
            group.kill_all()
            return Redelivery(
                result.id,
                runs(store, key),
                attempts(store, key),
                overlaps(store, key),
                client.AsyncResult(result.id).state,
            )
    finally:
        close_client(client)
        store.close()


@pytest.fixture(scope="module")
def redeliveries(redelivery_broker: Servers) -> Iterator[SideBySide[Redelivery]]:
    """The two redelivery scenarios (10 s and 14 s of watching, each with workers, key and
    queue of its own) run side by side."""
    # body 6 s, watched 10 s: the first run has ended and acked well before the end
    skip = (redelivery_broker, expiry.late_ack_skip, 6), {"watch": 10}
    # Every run (6 s) outlives the visibility timeout (2 s), so the message is handed out
    # again while it runs; with "retry" the copies wait, and once the original has finished
    # they must be dropped rather than run the body again. Watch 14 s.
    retry = (redelivery_broker, expiry.late_ack_retry, 6), {"watch": 14}
    yield from side_by_side(run_redelivery, [skip, retry], at_once=2)


@pytest.fixture(scope="module")
def redelivery_skip(redeliveries: SideBySide[Redelivery], redelivery_broker: Servers) -> Redelivery:
    outcome = redeliveries(redelivery_broker, expiry.late_ack_skip, 6, watch=10)
    print(f"redelivery, on_duplicate='skip': {outcome.summary()}")
    return outcome


def test_late_ack_message_is_redelivered_while_its_body_runs(redelivery_skip: Redelivery) -> None:
    # the premise of the redelivery tests: the visibility timeout handed the message out again
    assert len(redelivery_skip.attempts) >= 2
    assert any(a.redelivered for a in redelivery_skip.attempts[1:])
    assert {a.task_id for a in redelivery_skip.attempts} == {redelivery_skip.task_id}


def test_redelivered_copy_is_skipped_while_the_first_runs_and_the_body_runs_once(
    redelivery_skip: Redelivery,
) -> None:
    assert redelivery_skip.overlaps == 0
    assert len(redelivery_skip.runs) == 1


@pytest.fixture(scope="module")
def redelivery_retry(
    redeliveries: SideBySide[Redelivery], redelivery_broker: Servers
) -> Redelivery:
    outcome = redeliveries(redelivery_broker, expiry.late_ack_retry, 6, watch=14)
    print(f"redelivery, on_duplicate='retry': {outcome.summary()}")
    return outcome


def test_redelivered_copies_under_retry_wait_and_never_run_alongside(
    redelivery_retry: Redelivery,
) -> None:
    assert any(a.redelivered for a in redelivery_retry.attempts)
    assert any(a.lock_retries > 0 for a in redelivery_retry.attempts)  # copies waited
    assert redelivery_retry.overlaps == 0


def test_redelivered_copies_under_retry_are_dropped_once_the_original_finished(
    redelivery_retry: Redelivery,
) -> None:
    assert len(redelivery_retry.runs) == 1


def test_redelivered_copies_never_overwrite_the_originals_stored_outcome(
    redelivery_retry: Redelivery, redelivery_skip: Redelivery
) -> None:
    assert (redelivery_retry.final_state, redelivery_skip.final_state) == ("SUCCESS", "SUCCESS")


# -- 6. RabbitMQ as the broker (Redis stays the lock server and result backend) ---------------


@dataclass
class Rabbit:
    servers: Servers
    client: Celery
    queues: list[str]

    def queue(self) -> str:
        name = unique("csl-test")
        self.queues.append(name)
        return name


@pytest.fixture(scope="module")
def rabbit(servers: Servers) -> Iterator[Rabbit]:
    if not rabbitmq_available():
        pytest.skip("RabbitMQ is not reachable on 127.0.0.1:5672")
    try:
        with Connection(RABBITMQ_URL, connect_timeout=2) as probe:
            probe.ensure_connection(max_retries=1)
    except Exception as exc:  # noqa: BLE001 (any failure means: no usable RabbitMQ)
        pytest.skip(f"RabbitMQ on 127.0.0.1:5672 refused guest/guest: {exc!r}")
    rabbit_servers = Servers(
        broker_url=RABBITMQ_URL, lock=servers.lock, backend_url=servers.backend_url
    )
    client = client_app(rabbit_servers)
    setup = Rabbit(rabbit_servers, client, [])
    try:
        yield setup
    finally:
        close_client(client)
        purge_and_delete(setup.queues)


def purge_and_delete(queues: list[str]) -> None:
    """Purge and delete our queues and their exchanges (a channel per step: an AMQP error
    closes the channel it happened on)."""
    with Connection(RABBITMQ_URL, connect_timeout=2) as connection:
        for name in queues:  # celery declared each with a direct exchange of the same name
            for step in ("queue_purge", "queue_delete", "exchange_delete"):
                with contextlib.suppress(Exception), connection.channel() as channel:
                    getattr(channel, step)(name)


@pytest.fixture(scope="module")
def rabbit_contention(rabbit: Rabbit) -> Contention:
    outcome = contend(rabbit.servers, rabbit.client, 200, queue=rabbit.queue())
    print(
        f"contention (RabbitMQ broker): 200 same-key tasks ran in {outcome.duration:.1f}s "
        f"after {outcome.lock_retries} lock retries; {outcome.states}"
    )
    return outcome


@pytest.mark.rabbitmq
def test_rabbitmq_contention_every_task_runs_exactly_once(rabbit_contention: Contention) -> None:
    assert rabbit_contention.misruns() == {"ran more than once": [], "never ran": []}


@pytest.mark.rabbitmq
def test_rabbitmq_contention_every_task_ends_in_success(rabbit_contention: Contention) -> None:
    assert rabbit_contention.not_succeeded == {}


@pytest.mark.rabbitmq
def test_rabbitmq_contention_bodies_never_overlap(rabbit_contention: Contention) -> None:
    assert rabbit_contention.overlaps == 0


@pytest.mark.rabbitmq
def test_rabbitmq_contention_leaves_no_lock_behind(rabbit_contention: Contention) -> None:
    assert not rabbit_contention.lock_left


@pytest.mark.rabbitmq
@pytest.mark.full  # the same scenario runs on the Redis broker in the suite; ~14 s here
def test_rabbitmq_long_body_with_a_short_ttl_never_runs_alongside_its_duplicate(
    rabbit: Rabbit, lock_store: redis.Redis, key: str
) -> None:
    with worker_group(rabbit.servers) as group:
        ran = long_body_with_duplicate(group, rabbit.client, lock_store, key, rabbit.queue())
    assert len(ran) == 2
    assert overlaps(lock_store, key) == 0
    assert ran[1].started >= ran[0].started + 5 - 0.05


@pytest.mark.rabbitmq
def test_rabbitmq_sigkill_of_the_pool_child_lock_is_freed_by_the_main_process(
    rabbit: Rabbit, lock_store: redis.Redis, key: str
) -> None:
    with worker_group(rabbit.servers) as group:
        (worker,) = group.start(1, pool="prefork", concurrency=2, queue=rabbit.queue())
        reported, took = kill_child_running_the_task(worker, rabbit.client, lock_store, key)
    assert took < RECLAIM_WITHIN
    assert reported + took < CELERY_NOTICES_DEAD_CHILD_WITHIN + RECLAIM_WITHIN
