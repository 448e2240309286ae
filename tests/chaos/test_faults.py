"""Faults under real ``celery worker`` processes, on loopback Redis servers only.

1. kill -9 of whole workers (main process and pool) in the middle of fenced balance updates;
2. the lock server SIGKILLed and restarted (AOF, ``appendfsync always``) mid-run;
3. a worker holding a fenced lock stalled (SIGSTOP of its main process and pool) past its
   TTL while another worker takes the key over;
4. redelivery of acks_late tasks whose body outlives the broker's visibility timeout;
5. two ``celery beat`` schedulers and two workers (``python -m examples.beat_singleton``).

Each scenario runs at a reduced size by default (the whole file takes a few minutes on two
cores) and at full size with ``--full`` (the ``full`` marker). Balance updates go to a fenced,
idempotent store on a Redis server of its own (tests/chaos/fenced_store.py); tasks are the
ones in tests/celery/tasks/chaos.py. Fault moments are random: the seed is
printed with the figures, and ``CSL_CHAOS_SEED`` replays one. Every loop is bounded in count
and in time. Figures are printed and listed in the "chaos figures" section of the summary.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest
import redis
from celery.result import AsyncResult

from celery_singleton_lock.engine import LockInspector
from celery_singleton_lock.testing import RedisServer
from tests.celery.tasks import chaos, expiry
from tests.celery.workers import (
    START_TIMEOUT,
    CeleryWorkerProcess,
    Servers,
    WorkerGroup,
    client_app,
    close_client,
    lock_key,
    unique,
    worker_group,
)
from tests.chaos.fenced_store import LOCK_LOST_LIST, FencedStore, Ledger
from tests.support import sleep_for, wait_until

ROOT = Path(__file__).resolve().parents[2]
LOCK_PREFIX = "singleton-lock:"
SEED = int(os.environ.get("CSL_CHAOS_SEED") or time.time_ns() % 2**32)

#: Seconds the Redis broker waits before it hands an unacknowledged message out again.
VISIBILITY_TIMEOUT = 5.0
#: Lock TTL of chaos_balance (lock_ttl=3) and chaos_stall (lock_ttl=1).
BALANCE_TTL = 3.0
STALL_TTL = 1.0
#: Beyond TTL + restart time, what a recovery may take: the lock-retry backoff (<= 0.5 s),
#: kombu's restore of unacked messages (every 0.5 s) and scheduling on two shared cores.
RECOVERY_SLACK = 2.5

Figures = Callable[[dict[str, Any]], None]


def full(*marks: Any) -> list[Any]:
    """Parameters ``reduced`` and ``full`` (the latter runs only with ``--full``)."""
    return [
        pytest.param("reduced", id="reduced"),
        pytest.param("full", marks=[pytest.mark.full, *marks], id="full"),
    ]


# -- servers ----------------------------------------------------------------------------------


@dataclass
class ChaosServers(Servers):
    """Broker (results in its db 1), lock server, and the store: three Redis servers."""

    store_url: str = ""

    def env(self, queue: str, **extra: str) -> dict[str, str]:
        return super().env(queue, CSL_STORE_URL=self.store_url, **extra)


@contextlib.contextmanager
def chaos_servers(
    *, lock_args: tuple[str, ...] = (), visibility_timeout: Optional[float] = None
) -> Iterator[ChaosServers]:
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(RedisServer.running())
        lock = stack.enter_context(RedisServer.running(extra_args=lock_args))
        store = stack.enter_context(RedisServer.running())
        yield ChaosServers(
            broker_url=broker.url,
            lock=lock,
            visibility_timeout=visibility_timeout,
            store_url=store.url,
        )


def start_workers(
    group: WorkerGroup, queues: list[str], concurrency: int = 2
) -> list[CeleryWorkerProcess]:
    """One prefork worker per entry of ``queues``, started in parallel."""
    workers = [
        CeleryWorkerProcess(group.servers, queue=q, concurrency=concurrency, log_dir=group.log_dir)
        for q in queues
    ]
    group.workers.extend(workers)
    for worker in workers:
        worker.launch()
    for worker in workers:
        worker.wait_ready()
    return workers


def store_client(servers: ChaosServers) -> redis.Redis:
    return redis.Redis.from_url(servers.store_url, socket_timeout=5, socket_connect_timeout=2)


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def lock_keys(client: redis.Redis) -> list[str]:
    """The lock keys on the lock server: they end with their hash tag (fence counters and
    finish records do not)."""
    return [text(k) for k in client.scan_iter(match=f"{LOCK_PREFIX}*}}", count=1000)]


def holders(client: redis.Redis) -> dict[str, str]:
    """Lock key -> the node (worker name) that holds it."""
    found = {}
    for key in lock_keys(client):
        value = client.get(key)
        if value is not None:
            # <token>|<fence>|<acquired_at>|<pid>|<host>|<task_id>
            parts = text(value).split("|", 5)
            if len(parts) == 6:
                found[key] = parts[4]
    return found


def fence_counters(client: redis.Redis, keys: dict[str, str]) -> dict[str, int]:
    """Account -> the counter its fences come from on the lock server, as the engine reads it
    (``keys``: lock key -> account; one counter per server, so the accounts share it)."""
    inspector = LockInspector(client, prefix=LOCK_PREFIX.rstrip(":"))
    # a lock key is <prefix>:{<name>}
    return {
        account: inspector.fence(key[len(LOCK_PREFIX) + 1 : -1]) for key, account in keys.items()
    }


def wait_no_locks(client: redis.Redis, timeout: float) -> tuple[int, float]:
    """Wait up to ``timeout`` s for every lock key to be gone: (keys left, seconds waited)."""
    started = time.monotonic()
    for _ in range(int(timeout / 0.05) + 2):
        left = len(lock_keys(client))
        if left == 0 or time.monotonic() - started >= timeout:
            return left, time.monotonic() - started
        time.sleep(0.05)
    return len(lock_keys(client)), time.monotonic() - started


# -- 1 & 2: fenced balance updates under faults -----------------------------------------------


@dataclass
class Plan:
    updates: int
    accounts: int
    rate: float  # updates sent per second
    kills: int = 0  # kill -9 of a whole worker, each followed by a restart
    lock_restarts: int = 0  # SIGKILL + restart of the lock server
    outage: float = 4.0  # seconds the lock server stays down each time
    work: float = 0.05  # seconds between the read and the write of an update
    after: float = 0.04  # seconds an update keeps its lock after its write
    drain: float = 120.0  # seconds allowed for the last updates after the last send


@dataclass
class Kill:
    at: float  # time.time() of the kill
    victim: str
    held: list[str]  # accounts whose lock the killed worker held (orphaned by the kill)
    restart_seconds: Optional[float] = None  # kill -> the new worker's "ready."
    recoveries: dict[str, Optional[float]] = field(default_factory=dict)


@dataclass
class LockRestart:
    down_at: float
    up_at: Optional[float] = None
    fences_before: dict[str, int] = field(default_factory=dict)
    fences_after: dict[str, int] = field(default_factory=dict)
    resumed_after: Optional[float] = None  # seconds from "up" to the next body start


@dataclass
class BalanceOutcome:
    plan: Plan
    ledger: Ledger
    kills: list[Kill]
    restarts: list[LockRestart]
    seconds: float
    stuck_locks: int
    locks_gone_after: float
    stale: int
    already: int
    runs: int
    fence_repeats: int  # (account, fence) pairs given to two body runs
    fences_behind_store: list[str]  # accounts whose counter is below a fence the store saw
    backend_errors: int  # worker log ERROR lines "...; retrying later"
    lock_lost: int
    #: updates sent that no worker ever logged received (see run_balances): not in ``ledger``
    lost_by_broker: list[str] = field(default_factory=list)

    @property
    def recoveries(self) -> list[float]:
        return [r for k in self.kills for r in k.recoveries.values() if r is not None]

    def figures(self, size: str) -> dict[str, Any]:
        return {
            "size": size,
            "seed": SEED,
            "updates_sent": self.ledger.updates,
            "updates_applied": self.ledger.applied,
            "lost": self.ledger.lost,
            "doubled": self.ledger.doubled,
            "wrong_accounts": len(self.ledger.wrong_accounts),
            "kills_survived": len(self.kills),
            "kills_that_orphaned_a_lock": sum(1 for k in self.kills if k.held),
            "restarts_survived": len(self.restarts),
            "stuck_locks": self.stuck_locks,
            "max_recovery_s": round(max(self.recoveries), 2) if self.recoveries else None,
            "max_worker_restart_s": max(
                (round(k.restart_seconds, 2) for k in self.kills if k.restart_seconds), default=None
            ),
            "max_resume_after_lock_server_up_s": max(
                (round(r.resumed_after, 2) for r in self.restarts if r.resumed_after is not None),
                default=None,
            ),
            "body_runs": self.runs,
            "writes_refused_by_fence": self.stale,
            "idempotent_repeats": self.already,
            "fence_repeats": self.fence_repeats,
            "backend_error_retries_logged": self.backend_errors,
            "lock_lost_signals": self.lock_lost,
            "lost_by_the_broker_never_received": len(self.lost_by_broker),
            "seconds": round(self.seconds, 1),
        }


def run_balances(servers: ChaosServers, plan: Plan) -> BalanceOutcome:
    """Send ``plan.updates`` chaos_balance updates at ``plan.rate`` per second to 2 prefork
    workers x 2, injecting the planned faults at random moments; wait until all are applied."""
    rng = random.Random(SEED)
    ns = unique("bal")
    accounts = [f"{ns}-a{i}" for i in range(plan.accounts)]
    work = [
        (rng.choice(accounts), rng.randint(1, 50_000) * rng.choice((1, -1)))
        for _ in range(plan.updates)
    ]
    span = plan.updates / plan.rate

    def moments(count: int) -> list[float]:
        """One random moment in each of ``count`` equal slices of 10%..85% of the sending."""
        low, width = 0.1 * span, 0.75 * span / max(count, 1)
        return [low + (i + rng.uniform(0.1, 0.9)) * width for i in range(count)]

    kill_due, restart_due = moments(plan.kills), moments(plan.lock_restarts)
    account_of = {lock_key(chaos.chaos_balance, a, 0, ""): a for a in accounts}
    store = FencedStore(store_client(servers), ns)
    locks = servers.lock.client(socket_timeout=2, socket_connect_timeout=1)
    broker = redis.Redis.from_url(servers.broker_url, socket_timeout=5)
    client = client_app(servers)
    kills: list[Kill] = []
    restarts: list[LockRestart] = []
    sent: dict[str, tuple[str, int]] = {}
    try:
        with worker_group(servers) as group:
            queue = unique("q")
            live = start_workers(group, [queue, queue])
            began = time.monotonic()
            sent_count = 0
            arming: Optional[tuple[CeleryWorkerProcess, float]] = None  # victim, kill deadline
            restarting: Optional[tuple[CeleryWorkerProcess, Kill, float]] = None
            down: Optional[tuple[LockRestart, float]] = None  # record, restart at (monotonic)
            budget = span + plan.kills * (START_TIMEOUT + 5) + plan.lock_restarts * 10 + 30
            for _ in range(int(budget / 0.01) + 1):
                now = time.monotonic()
                elapsed = now - began
                if elapsed > budget:
                    pytest.fail(f"fault schedule not done within {budget:.0f}s\n{group.logs()}")
                # the updates due by now
                while sent_count < len(work) and sent_count <= elapsed * plan.rate:
                    account, cents = work[sent_count]
                    result = client.send_task(
                        chaos.chaos_balance.name,
                        args=(account, cents, ns, plan.work, plan.after),
                        queue=queue,
                    )
                    sent[result.id] = (account, cents)
                    sent_count += 1
                # a restarted worker coming up
                if restarting is not None:
                    worker, record, killed = restarting
                    if f"{worker.name} ready." in worker.log():
                        record.restart_seconds = time.monotonic() - killed
                        restarting = None
                    elif not worker.running or time.monotonic() - killed > START_TIMEOUT:
                        pytest.fail(f"restarted worker did not come up:\n{worker.log_tail()}")
                # kill -9: at a random moment, once the victim holds a lock (waiting <= 2 s),
                # plus 0-90 ms: before the claim, between claim and write, after the write
                # (still locked, not yet acknowledged), or after the release
                if arming is not None:
                    victim, deadline = arming
                    if victim.name in holders(locks).values() and deadline > now + 0.09:
                        # the first kill right away: at least one kill orphans a lock
                        deadline = now + (rng.uniform(0.0, 0.09) if kills else 0.0)
                        arming = (victim, deadline)
                    if now >= deadline:
                        arming = None
                        restarting = kill_and_restart(victim, live, group, queue, locks, account_of)
                        kills.append(restarting[1])
                elif kill_due and elapsed >= kill_due[0] and restarting is None and down is None:
                    kill_due.pop(0)
                    arming = (rng.choice(live), now + 2.0)
                # the lock server going down and coming back
                if down is not None:
                    record, up_at = down
                    if now >= up_at:
                        servers.lock.start()
                        record.up_at = time.time()
                        record.fences_after = fence_counters(locks, account_of)
                        down = None
                elif (
                    restart_due
                    and elapsed >= restart_due[0]
                    and arming is None
                    and restarting is None
                ):
                    restart_due.pop(0)
                    record = LockRestart(
                        down_at=0.0, fences_before=fence_counters(locks, account_of)
                    )
                    servers.lock.stop()  # SIGKILL
                    record.down_at = time.time()
                    restarts.append(record)
                    down = (record, now + plan.outage)
                if (
                    sent_count == len(work)
                    and not kill_due
                    and not restart_due
                    and arming is None
                    and restarting is None
                    and down is None
                ):
                    break
                time.sleep(0.01)
            # every update applied, or every one the broker did not lose (see below), or the
            # drain time is up
            drain_end = time.monotonic() + plan.drain
            settled = 0
            for step in range(int(plan.drain / 0.1) + 1):
                if store.applied_count() >= len(sent) or time.monotonic() > drain_end:
                    break
                if step % 10 == 9:  # once a second: seen twice in a row, 1 s apart
                    settled = settled + 1 if only_lost_left(group, broker, sent, store) else 0
                    if settled == 2:
                        break
                time.sleep(0.1)
            seconds = time.monotonic() - began
            stuck, gone_after = wait_no_locks(locks, BALANCE_TTL + 2)
            logs = [w.log() for w in group.workers]
        # A Redis broker can lose a message that was on its way to a worker killed with
        # SIGKILL: kombu's transport takes it off the queue (BRPOP) and only then records it
        # as unacknowledged, and a message still in the dead worker's socket is gone too
        # (celery/celery#4354, celery/kombu#305). No worker ever logged it received: the lock
        # never saw it, and the lock's promises (none lost, none doubled) are about the rest.
        received = received_task_ids(logs)
        lost_by_broker = sorted(task_id for task_id in sent if task_id not in received)
        ledger = store.analyse({t: sent[t] for t in sent if t not in lost_by_broker})
        runs = store.runs()
        for kill in kills:
            for account in kill.held:
                later = [r.at for r in runs if r.account == account and r.at > kill.at]
                kill.recoveries[account] = min(later) - kill.at if later else None
        for restart in restarts:
            later = [r.at for r in runs if restart.up_at is not None and r.at > restart.up_at]
            restart.resumed_after = min(later) - restart.up_at if later else None
        fences = Counter((r.account, r.fence) for r in runs)
        counters = fence_counters(locks, account_of)
        return BalanceOutcome(
            plan=plan,
            ledger=ledger,
            kills=kills,
            restarts=restarts,
            seconds=seconds,
            stuck_locks=stuck,
            locks_gone_after=gone_after,
            stale=store.counter("stale"),
            already=store.counter("already"),
            runs=len(runs),
            fence_repeats=sum(n - 1 for n in fences.values()),
            fences_behind_store=[a for a in accounts if counters[a] < store.account(a)[2]],
            backend_errors=sum(
                1
                for log in logs
                for line in log.splitlines()
                if "ERROR" in line and "retrying later" in line
            ),
            lock_lost=int(store.client.llen(LOCK_LOST_LIST)),
            lost_by_broker=lost_by_broker,
        )
    finally:
        close_client(client)
        locks.close()
        broker.close()
        store.client.close()


def only_lost_left(
    group: WorkerGroup, broker: redis.Redis, sent: dict[str, Any], store: FencedStore
) -> bool:
    """Every update a worker logged received is applied and the broker holds none: none
    waiting in a queue, none delivered and unacknowledged (kombu's ``unacked`` hash, where a
    killed worker's messages wait to be restored). What was sent and is not applied then was
    lost by the broker (see run_balances), and never will be: waiting on is the drain's
    whole time (two minutes) for nothing."""
    received = received_task_ids([worker.log() for worker in group.workers])
    if store.applied_count() < len(received & sent.keys()):
        return False
    return broker.hlen("unacked") == 0 and not any(
        broker.type(key) == b"list" and broker.llen(key) for key in broker.scan_iter(count=1000)
    )


def kill_and_restart(
    victim: CeleryWorkerProcess,
    live: list[CeleryWorkerProcess],
    group: WorkerGroup,
    queue: str,
    locks: redis.Redis,
    account_of: dict[str, str],
) -> tuple[CeleryWorkerProcess, Kill, float]:
    """SIGKILL the victim's whole process group, note the locks it orphaned, launch another
    worker on the same queue (not waiting for it)."""
    victim.kill_group(signal.SIGKILL)
    killed = time.monotonic()
    record = Kill(at=time.time(), victim=victim.name, held=[])
    victim._cleanup()  # reaps the main process (its children were killed with it)
    time.sleep(0.05)
    record.held = sorted(account_of[k] for k, node in holders(locks).items() if node == victim.name)
    live.remove(victim)
    fresh = CeleryWorkerProcess(group.servers, queue=queue, concurrency=2, log_dir=group.log_dir)
    group.workers.append(fresh)
    fresh.launch()
    live.append(fresh)
    return fresh, record, killed


def received_task_ids(logs: list[str]) -> set[str]:
    """The task ids the workers logged received (Celery's "Task NAME[ID] received")."""
    return {match.group(1) for log in logs for match in RECEIVED.finditer(log)}


RECEIVED = re.compile(r"Task [\w.]+\[([0-9a-f-]+)\] received")


def assert_exact(outcome: BalanceOutcome) -> None:
    # only a killed worker's in-flight messages can be lost by the broker, a few per kill
    assert len(outcome.lost_by_broker) <= 2 * len(outcome.kills), outcome.lost_by_broker
    ledger = outcome.ledger
    assert ledger.applied == ledger.updates, f"{ledger.updates - ledger.applied} never applied"
    assert ledger.lost == 0
    assert ledger.doubled == 0
    assert ledger.unexplained == 0
    assert ledger.foreign == 0
    assert ledger.wrong_accounts == []
    assert outcome.stuck_locks == 0, f"{outcome.stuck_locks} lock keys outlived their TTL"
    assert outcome.fence_repeats == 0, "a fence was handed out twice for one key"
    assert outcome.fences_behind_store == []


KILL_PLANS = {
    "reduced": Plan(updates=180, accounts=5, rate=10.0, kills=3),
    "full": Plan(updates=2000, accounts=8, rate=12.0, kills=12, drain=240.0),
}


@pytest.mark.parametrize("size", full(pytest.mark.timeout(1200)))
def test_kill_9_of_whole_workers_during_fenced_balance_updates(
    size: str, chaos_figures: Figures
) -> None:
    plan = KILL_PLANS[size]
    with chaos_servers(visibility_timeout=VISIBILITY_TIMEOUT) as servers:
        outcome = run_balances(servers, plan)
    chaos_figures(outcome.figures(size))
    assert len(outcome.kills) == plan.kills
    assert any(kill.held for kill in outcome.kills), "no kill caught a worker holding a lock"
    assert_exact(outcome)
    # every lock the kill orphaned: its key ran again within the TTL (+ the restart time)
    for kill in outcome.kills:
        for account, took in kill.recoveries.items():
            assert took is not None, f"{account} never ran again after the kill at {kill.at}"
            bound = BALANCE_TTL + (kill.restart_seconds or START_TIMEOUT) + RECOVERY_SLACK
            assert took <= bound, f"{account}: {took:.2f}s from the kill to its next run"


RESTART_PLANS = {
    "reduced": Plan(updates=120, accounts=5, rate=10.0, lock_restarts=1),
    "full": Plan(updates=1000, accounts=8, rate=10.0, lock_restarts=4, drain=240.0),
}


@pytest.mark.parametrize("size", full(pytest.mark.timeout(900)))
def test_lock_server_restart_mid_run_keeps_fences_and_loses_nothing(
    size: str, chaos_figures: Figures
) -> None:
    plan = RESTART_PLANS[size]
    # the documented setting for fencing: every fence increment on disk before the reply
    aof = ("--appendonly", "yes", "--appendfsync", "always")
    with chaos_servers(lock_args=aof) as servers:
        outcome = run_balances(servers, plan)
    chaos_figures(outcome.figures(size))
    assert len(outcome.restarts) == plan.lock_restarts
    assert_exact(outcome)
    for restart in outcome.restarts:
        assert restart.fences_before, "no fence had been handed out before the restart"
        for account, before in restart.fences_before.items():
            assert restart.fences_after[account] >= before, f"fence counter of {account} reset"
    # tasks that found the lock server down were sent again (lock_on_backend_error="retry")
    assert outcome.backend_errors >= 1


# -- 3: a stalled holder ----------------------------------------------------------------------


@pytest.mark.parametrize("size", full())
def test_stalled_holder_write_is_refused_by_the_fence_and_it_learns_it_lost_the_lock(
    size: str, chaos_figures: Figures
) -> None:
    rounds = 1 if size == "reduced" else 5
    outcomes: list[dict[str, Any]] = []
    with chaos_servers() as servers, worker_group(servers) as group:
        stalled_q, other_q = unique("q-stalled"), unique("q-other")
        stalled_worker, _ = start_workers(group, [stalled_q, other_q])
        ns = unique("stall")
        store = FencedStore(store_client(servers), ns)
        locks = servers.lock.client(socket_timeout=5)
        client = client_app(servers)
        try:
            for n in range(rounds):
                outcomes.append(
                    stall_round(client, store, locks, stalled_worker, stalled_q, other_q, n)
                )
            left, _ = wait_no_locks(locks, STALL_TTL + 2)
            lost_ids = {
                text(raw).split("|")[0] for raw in store.client.lrange(LOCK_LOST_LIST, 0, -1)
            }
        finally:
            close_client(client)
            locks.close()
            store.client.close()
    chaos_figures(
        {
            "size": size,
            "stalls_survived": len(outcomes),
            "stale_writes_refused": sum(o["first"]["write"] == "stale" for o in outcomes),
            "lock_lost_signals": sum(o["first_id"] in lost_ids for o in outcomes),
            "handles_reporting_lost": sum(o["first"]["lost"] is True for o in outcomes),
            "wrong_balances": sum(o["balance"] != o["second_cents"] for o in outcomes),
            "stuck_locks": left,
            "max_stall_s": round(max(o["stalled_s"] for o in outcomes), 2),
            "fences": [(o["first"]["fence"], o["second"]["fence"]) for o in outcomes],
        }
    )
    for o in outcomes:
        assert o["stalled_s"] > STALL_TTL
        assert o["second"]["write"] == "applied"
        assert o["second"]["fence"] > o["first"]["fence"]
        assert o["first"]["write"] == "stale"  # refused by the fence
        assert o["balance"] == o["second_cents"]  # only the new holder's write is in
        assert o["first_id"] in lost_ids  # lock_lost was sent for the stalled execution
        assert o["first"]["lost"] is True
        assert o["first"]["check_raised"] == "LockLostError"
        assert o["second"]["lost"] is False
    assert left == 0


def stall_round(
    client: Any,
    store: FencedStore,
    locks: redis.Redis,
    stalled_worker: CeleryWorkerProcess,
    stalled_q: str,
    other_q: str,
    n: int,
) -> dict[str, Any]:
    """chaos_stall holds ``account`` (ttl 1 s) on one worker, which is SIGSTOPped whole between
    the claim-read and the write, for 2.5 TTLs and until another worker took the key and wrote.

    The whole process group: the worker's main process renews its children's locks (see
    celery_singleton_lock.celery.worker.child_renewal), so a stopped child alone keeps its lock."""
    account = f"{store.ns}-a{n}"
    go = store.key("go", str(n))
    task = chaos.chaos_stall.name
    name = lock_key(chaos.chaos_stall, account, 0, "")
    first = client.send_task(task, args=(account, 100, store.ns, go), queue=stalled_q)
    run = wait_until(
        lambda: next((r for r in store.runs() if r.task_id == first.id), None), timeout=20
    )
    assert run.pid in stalled_worker.children()
    wait_until(lambda: store.account(account)[2] == run.fence, timeout=10)  # claimed
    stalled_worker.kill_group(signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        wait_until(lambda: locks.exists(name) == 0, timeout=STALL_TTL + 5, interval=0.02)
        sleep_for(2.5 * STALL_TTL - (time.monotonic() - stopped))
        second = client.send_task(task, args=(account, 1000, store.ns, None), queue=other_q)
        second_outcome = second.get(timeout=30)
        stalled_s = time.monotonic() - stopped
    finally:
        store.client.set(go, 1)
        stalled_worker.kill_group(signal.SIGCONT)
    first_outcome = first.get(timeout=30)
    wait_until(
        lambda: any(
            text(raw).startswith(first.id) for raw in store.client.lrange(LOCK_LOST_LIST, 0, -1)
        ),
        timeout=10,
    )
    return {
        "first_id": first.id,
        "first": first_outcome,
        "second": second_outcome,
        "second_cents": 1000,
        "balance": store.account(account)[0],
        "stalled_s": stalled_s,
    }


# -- 4: redelivery of acks_late tasks that outlive the visibility timeout ---------------------

#: size -> (tasks, distinct keys, seconds watched at most before all must have succeeded)
REDELIVERY_SIZES = {"reduced": (12, 4, 40.0), "full": (80, 8, 150.0)}
REDELIVERY_BODY = 3.0
REDELIVERY_VISIBILITY = 2.0


@dataclass
class RedeliveryOutcome:
    size: str
    task_ids: list[str]
    key_count: int
    runs: dict[str, list[tuple[str, float]]]  # key -> (task id, start time) per body run
    deliveries: int
    redelivered: int
    gauge_overlaps: int
    states: dict[str, int]
    all_succeeded_after: Optional[float]  # seconds until every task had stored SUCCESS
    stuck_locks: int

    @property
    def interval_overlaps(self) -> int:
        """Pairs of consecutive runs of one key that started less than a body apart."""
        found = 0
        for key_runs in self.runs.values():
            starts = sorted(started for _, started in key_runs)
            found += sum(1 for a, b in zip(starts, starts[1:]) if b < a + REDELIVERY_BODY - 0.01)
        return found

    @property
    def per_task(self) -> Counter[str]:
        return Counter(task_id for key_runs in self.runs.values() for task_id, _ in key_runs)


@pytest.fixture(scope="module", params=full(pytest.mark.timeout(900)))
def redelivery(request: pytest.FixtureRequest) -> RedeliveryOutcome:
    """late_ack_retry (acks_late, lock_ttl=2, on_duplicate="retry") bodies of 3 s on 2
    prefork workers x 2, whose Redis broker hands unacknowledged messages out again after 2 s:
    every message is redelivered while its body runs. Tasks share a few keys (task i uses key
    i % keys), so copies of one task id and other tasks of the same key both contend.
    Watched until every task stored SUCCESS (at most the size's window), then 4 s more for
    late copies; then the workers are killed and everything is counted. The workers track
    STARTED (``task_track_started``), which LockedTask stores only once the lock is held."""
    size = request.param
    tasks, key_count, window = REDELIVERY_SIZES[size]
    servers_cm = chaos_servers(visibility_timeout=REDELIVERY_VISIBILITY)
    with servers_cm as servers, worker_group(servers) as group:
        queue = unique("q")
        start_workers(group, [queue, queue])
        keys = [unique("redeliver") for _ in range(key_count)]
        lock_store = servers.lock.client(socket_timeout=5)
        client = client_app(servers)
        try:
            began = time.monotonic()
            task_ids = [
                client.send_task(
                    expiry.late_ack_retry.name,
                    args=(keys[i % key_count], REDELIVERY_BODY),
                    queue=queue,
                ).id
                for i in range(tasks)
            ]
            succeeded_after: Optional[float] = None
            for _ in range(int(window / 0.5) + 1):
                states = Counter(AsyncResult(t, app=client).state for t in task_ids)
                if states["SUCCESS"] == tasks:
                    succeeded_after = time.monotonic() - began
                    break
                if time.monotonic() - began > window:
                    break
                time.sleep(0.5)
            sleep_for(REDELIVERY_VISIBILITY + 2)  # copies still on their way
            group.kill_all()
            states = Counter(AsyncResult(t, app=client).state for t in task_ids)
            runs: dict[str, list[tuple[str, float]]] = {}
            deliveries = redelivered = 0
            for key in keys:
                runs[key] = []
                for raw in lock_store.lrange(f"runs:{key}", 0, -1):
                    task_id, _pid, started = text(raw).split("|")
                    runs[key].append((task_id, float(started)))
                for raw in lock_store.lrange(f"attempts:{key}", 0, -1):
                    deliveries += 1
                    redelivered += text(raw).split("|")[3] == "1"
            gauge_overlaps = sum(int(lock_store.get(f"overlaps:{key}") or 0) for key in keys)
            stuck, _ = wait_no_locks(lock_store, 2 + 2)  # lock_ttl=2: killed holders expire
        finally:
            close_client(client)
            lock_store.close()
    return RedeliveryOutcome(
        size=size,
        task_ids=task_ids,
        key_count=key_count,
        runs=runs,
        deliveries=deliveries,
        redelivered=redelivered,
        gauge_overlaps=gauge_overlaps,
        states=dict(states),
        all_succeeded_after=succeeded_after,
        stuck_locks=stuck,
    )


def test_redelivery_never_runs_one_key_twice_at_once(
    redelivery: RedeliveryOutcome, chaos_figures: Figures
) -> None:
    outcome = redelivery
    per_task = outcome.per_task
    chaos_figures(
        {
            "size": outcome.size,
            "tasks": len(outcome.task_ids),
            "keys": outcome.key_count,
            "deliveries": outcome.deliveries,
            "redelivered_by_visibility_timeout": outcome.redelivered,
            "body_runs": sum(per_task.values()),
            "tasks_run_more_than_once": sum(1 for n in per_task.values() if n > 1),
            "most_runs_of_one_task": max(per_task.values(), default=0),
            "tasks_never_run": sum(1 for t in outcome.task_ids if t not in per_task),
            "concurrent_same_key_gauge": outcome.gauge_overlaps,
            "concurrent_same_key_intervals": outcome.interval_overlaps,
            "all_succeeded_after_s": None
            if outcome.all_succeeded_after is None
            else round(outcome.all_succeeded_after, 1),
            "final_states": outcome.states,
            "stuck_locks": outcome.stuck_locks,
        }
    )
    assert outcome.redelivered >= 1, "the premise: messages were handed out again while running"
    assert outcome.gauge_overlaps == 0
    assert outcome.interval_overlaps == 0
    assert outcome.stuck_locks == 0


def test_redelivered_copies_never_run_again_once_the_original_finished(
    redelivery: RedeliveryOutcome,
) -> None:
    per_task = redelivery.per_task
    again = {t: n for t, n in per_task.items() if n > 1}
    assert again == {}, f"{len(again)} task(s) ran their body more than once: {again}"
    assert set(per_task) == set(redelivery.task_ids), "some task never ran"
    assert redelivery.states == {"SUCCESS": len(redelivery.task_ids)}


# -- 5: two beats, two workers ----------------------------------------------------------------

SERVER_ENV = (
    "REDIS_URL",
    "CELERY_BROKER_URL",
    "CELERY_RESULT_BACKEND",
    "SINGLETON_LOCK_URL",
    "EXAMPLE_DATA_URL",
    "EXAMPLE_NAMESPACE",
)


#: Full size only: the suite runs the same example for 12 s in
#: tests/examples/test_examples.py::test_beat_two_beats_two_workers_never_overlap.
@pytest.mark.parametrize("size", full(pytest.mark.timeout(600))[1:])
def test_two_beats_two_workers_never_overlap(size: str, chaos_figures: Figures) -> None:
    """``python -m examples.beat_singleton --seconds N --redis-url URL``: the example takes
    its Redis from ``--redis-url`` (else ``$REDIS_URL``, else it starts one of its own)."""
    seconds = 20 if size == "reduced" else 60
    env = {k: v for k, v in os.environ.items() if k not in SERVER_ENV}
    with RedisServer.running() as server:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "examples.beat_singleton",
                "--seconds",
                str(seconds),
                "--redis-url",
                server.url,
                "--no-progress",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = process.communicate(timeout=seconds + 120)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)  # the runner stops its workers and beats
            try:
                out, err = process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                out, err = process.communicate(timeout=10)
            pytest.fail(f"beat_singleton did not finish in time\n{out}\n{err}")
    output = f"--- stdout ---\n{out}\n--- stderr ---\n{err}"
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"no JSON summary\n{output}"
    summary = json.loads(lines[-1])
    chaos_figures(
        {
            "size": size,
            "seconds": seconds,
            "runs": summary["runs"],
            "skipped": summary["skipped"],
            "ticks_sent": summary["ticks_sent"],
            "overlaps": summary["overlaps"],
            "overlaps_seen": summary["overlaps_seen"],
            "longest_gap_s": summary["longest_gap_s"],
        }
    )
    assert process.returncode == 0, output
    assert summary["overlaps"] == 0, output
    assert summary["overlaps_seen"] == 0, output
    assert summary["runs"] >= 1, output
    assert summary["skipped"] >= 1, output
