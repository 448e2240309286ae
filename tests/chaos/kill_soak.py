"""A soak of ``kill -9`` of prefork pool children running a body (issue 19, part 1).

Two prefork workers (``-c 2``, prefetch 1) run a stream of calls of ``tests/chaos/soakapp.py``'s
``queue``, ``retry`` and ``skip`` tasks on a few keys each, sent at a steady rate; at intervals
one pool child running a body is picked at random and SIGKILLed, until the wanted number of
kills. Then the calls drain. Checked from the bodies' records and the stored results:

- hung: a call whose body ended but whose outcome was stored more than 5 s later, or never
  (the hang of issue 19: the child ended its body and then blocked for ever);
- lost: a call with no outcome at the end (nor an ended body);
- doubled: a call (task id) whose body started more than once;
- overlaps: two bodies of one key running at once (a killed body ends at its kill).

Used by ``tests/chaos/test_child_kills.py`` (about 100 kills; 1,000 with ``--full``) and by
``python -m bench soak``. Every loop is bounded in count and time; only loopback servers; only
pids that are pool children of the soak's own workers are ever killed.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterator, Optional

import redis
from celery import states

from celery_singleton_lock.testing import RedisServer
from tests.celery.workers import Servers, WorkerGroup, client_app, close_client, unique

APP = "tests.chaos.soakapp"
POLICIES = ("queue", "retry", "skip")
#: seconds a call whose body ended may take to have its outcome stored
PENDING_LIMIT = 5.0


@dataclass(frozen=True)
class Size:
    kills: int
    #: seconds between two calls sent (round robin over the policies, a random key each)
    send_every: float = 0.15
    #: seconds between two kills
    kill_every: float = 0.6
    #: seconds a body lasts
    body: float = 0.5
    #: keys per policy (few: duplicates park, retry and skip behind running bodies)
    keys: int = 2
    #: seconds the calls may take to drain after the last kill
    drain: float = 90.0


#: In the suite: 50 kills (about 40 s); the deterministic reproduction of the hang is
#: tests/celery/test_fork_while_sending.py, so the reduced soak guards the outcomes, not the race.
REDUCED = Size(kills=50)
FULL = Size(kills=1000)


@dataclass
class Figures:
    seed: int
    kills: int = 0
    calls: int = 0
    calls_by_policy: dict[str, int] = field(default_factory=dict)
    bodies_ended: int = 0
    bodies_killed: int = 0
    #: from the workers' logs: calls parked behind a lock, lock retries sent, locks of killed
    #: children freed by their worker's main process; from the outcomes: duplicates skipped
    parked: int = 0
    lock_retries: int = 0
    skipped: int = 0
    reclaimed: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    hung: int = 0  # body ended, outcome stored > PENDING_LIMIT s later or never
    lost: int = 0
    doubled: int = 0
    overlaps: int = 0
    max_end_to_outcome: float = 0.0
    seconds: float = 0.0

    @property
    def failed(self) -> list[str]:
        return [
            name for name in ("hung", "lost", "doubled", "overlaps") if getattr(self, name) != 0
        ]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "max_end_to_outcome": round(self.max_end_to_outcome, 3)}


@contextlib.contextmanager
def soak_servers() -> Iterator[Servers]:
    """Throwaway loopback servers: a broker (results in its db 1) and a lock server (which
    also holds the bodies' records)."""
    with RedisServer.running() as broker, RedisServer.running() as lock:
        yield Servers(
            broker_url=broker.url,
            lock=lock,
            app=APP,
        )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _Killer:
    """Kills, at random, a pool child of the soak's workers that runs a body now."""

    def __init__(self, group: WorkerGroup, records: redis.Redis, ns: str, rng: random.Random):
        self.group, self.records, self.ns, self.rng = group, records, ns, rng
        self.kills = 0

    def kill_one(self) -> bool:
        children = {pid for worker in self.group.workers for pid in worker.children()}
        running = [int(pid) for pid in self.records.hkeys(f"{self.ns}:running")]
        candidates = sorted(pid for pid in running if pid in children)
        if not candidates:
            return False
        pid = self.rng.choice(candidates)
        self.records.rpush(f"{self.ns}:kills", f"{pid}|{time.time()}")
        self.records.hdel(f"{self.ns}:running", str(pid))
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            self.kills += 1
        return True


def run(servers: Servers, size: Size, seed: int, say: Callable[[str], None] = print) -> Figures:
    """One soak on ``servers``; its figures (see the module doc)."""
    rng = random.Random(seed)
    figures = Figures(seed=seed)
    ns = unique("soak")
    records = servers.lock.client()
    queue = unique("q")
    client = client_app(servers, queue)
    calls: dict[str, str] = {}  # task id -> policy
    started = time.monotonic()
    group = WorkerGroup(servers)
    try:
        group.start(2, queue=queue, pool="prefork", concurrency=2)
        killer = _Killer(group, records, ns, rng)
        # bounded: the kills wanted at their pace, with room for a slow machine
        deadline = time.monotonic() + size.kills * size.kill_every * 3 + 60
        next_send = next_kill = time.monotonic()
        sent = 0
        while killer.kills < size.kills and time.monotonic() < deadline:
            now = time.monotonic()
            if now >= next_send:
                policy = POLICIES[sent % len(POLICIES)]
                key = f"{policy}-{rng.randrange(size.keys)}"
                result = client.send_task(
                    f"{APP}.soak_{policy}", args=(ns, key, size.body), queue=queue
                )
                calls[result.id] = policy
                sent += 1
                next_send += size.send_every
            if now >= next_kill and killer.kill_one():
                next_kill = now + size.kill_every
                if killer.kills % 100 == 0:
                    say(f"  {killer.kills} kills, {sent} calls, {now - started:.0f}s")
            time.sleep(0.01)
        figures.kills = killer.kills
        _drain(client, calls, size.drain)
        _analyse(figures, client, records, ns, calls)
    finally:
        group.stop_all()
        close_client(client)
        _count_in_logs(figures, group)
        shutil.rmtree(group.log_dir, ignore_errors=True)
    figures.seconds = round(time.monotonic() - started, 1)
    return figures


def _count_in_logs(figures: Figures, group: WorkerGroup) -> None:
    logs = "\n".join(worker.log() for worker in group.workers)
    figures.parked = logs.count("; queued behind it")
    figures.lock_retries = logs.count("lock retry")
    figures.reclaimed = logs.count("left by dead process")


def _drain(client: Any, calls: dict[str, str], timeout: float) -> None:
    """Wait (``timeout`` at most) until every call has an outcome."""
    waiting = set(calls)
    deadline = time.monotonic() + timeout
    while waiting and time.monotonic() < deadline:
        waiting = {
            task_id
            for task_id in waiting
            if client.backend.get_task_meta(task_id).get("status") not in states.READY_STATES
        }
        time.sleep(0.5)


def _done_at(meta: dict[str, Any]) -> Optional[float]:
    done = meta.get("date_done")
    if isinstance(done, str):
        done = datetime.fromisoformat(done)
    if not isinstance(done, datetime):
        return None
    return (done if done.tzinfo else done.replace(tzinfo=timezone.utc)).timestamp()


def _analyse(
    figures: Figures, client: Any, records: redis.Redis, ns: str, calls: dict[str, str]
) -> None:
    starts = [_text(s).split("|") for s in records.lrange(f"{ns}:starts", 0, -1)]
    ends = dict(_text(e).split("|") for e in records.lrange(f"{ns}:ends", 0, -1))
    kills = [_text(k).split("|") for k in records.lrange(f"{ns}:kills", 0, -1)]
    figures.calls = len(calls)
    figures.calls_by_policy = dict(Counter(calls.values()))
    figures.bodies_ended = len(ends)
    run_count = Counter(task_id for task_id, *_ in starts)
    figures.doubled = sum(1 for count in run_count.values() if count > 1)
    outcomes: Counter[str] = Counter()
    for task_id, policy in calls.items():
        meta = client.backend.get_task_meta(task_id)
        status = meta.get("status")
        result = meta.get("result")
        kind = type(result).__name__ if status in (states.FAILURE, states.REVOKED) else ""
        figures.skipped += kind == "DuplicateTaskSkipped"  # logged once per burst: counted here
        outcomes[f"{policy} {status}{' ' + kind if kind else ''}"] += 1
        ready = status in states.READY_STATES
        if task_id in ends:
            done = _done_at(meta) if ready else None
            late = None if done is None else done - float(ends[task_id])
            if late is None or late > PENDING_LIMIT:
                figures.hung += 1
            else:
                figures.max_end_to_outcome = max(figures.max_end_to_outcome, late)
        elif not ready:
            figures.lost += 1
    figures.outcomes = dict(sorted(outcomes.items()))
    figures.bodies_killed = sum(1 for task_id, *_ in starts if task_id not in ends)
    figures.overlaps = _overlaps(starts, ends, kills)


def _overlaps(starts: list[list[str]], ends: dict[str, str], kills: list[list[str]]) -> int:
    """Bodies of one key that started before the previous one of that key ended (a killed
    body ends at the first kill of its pid after its start; one with neither never ends)."""
    kill_times: dict[int, list[float]] = {}
    for pid, at in kills:
        kill_times.setdefault(int(pid), []).append(float(at))
    by_key: dict[str, list[tuple[float, float]]] = {}
    for task_id, key, pid, at in starts:
        begin = float(at)
        if task_id in ends:
            end = float(ends[task_id])
        else:
            end = min((k for k in kill_times.get(int(pid), []) if k >= begin), default=1e18)
        by_key.setdefault(key, []).append((begin, end))
    overlaps = 0
    for intervals in by_key.values():
        latest_end = 0.0
        for begin, end in sorted(intervals):
            if begin < latest_end:
                overlaps += 1
            latest_end = max(latest_end, end)
    return overlaps
