"""What a burst of skipped duplicates sends and logs (issue 29): events and log lines, counted.

Not a timing (``python -m bench celery`` times a skip against a no-op run, paired in one
worker). A real prefork worker of ``tests/celery/lockapp.py`` (``-c 2``, worker heartbeats on,
task events off: Celery's default), its broker on a private ``redis-server`` with an event
receiver of the bench's own on it (every event type counted, from before the first call):

1. the lock of ``hold_skip`` on one key is held from here, and ``--skips`` (200) calls of that
   key are sent at once: every one is skipped. Counted: task events that reach the receiver
   (target 0; the workers' heartbeats show that it hears the worker), ``PUBLISH`` calls on the
   broker server over the burst, and the skip's WARNING lines in the worker's log (target: one
   per pool child that skipped, per 10 s burst of a key);
2. the same with task events turned on (``celery control enable_events``), on another key:
   what a skip sends when events are wanted.

    python -m bench skips                # ~30 s
"""

from __future__ import annotations

import argparse
import collections
import threading
import time
from dataclasses import dataclass
from typing import Any, Counter, Optional, Sequence

import redis

from celery_singleton_lock.engine import Lease, Owner, RedisLocker
from celery_singleton_lock.testing import RedisServer

from ._common import BenchError, sized_options, versions, worker_group

#: the start of the skip's WARNING line (docs/reference/signals-events-logs.md)
SKIP_LINE = "skipped: lock "
CONCURRENCY = 2


class EventCounts:
    """Every event of the broker's ``celeryev`` exchange, counted by type, in a thread."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.counts: Counter[str] = collections.Counter()
        self.receiver: Any = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with self.app.connection() as connection:
            self.receiver = self.app.events.Receiver(
                connection, handlers={"*": lambda event: self.counts.update([event["type"]])}
            )
            self.receiver.capture(limit=None, timeout=None, wakeup=False)

    def close(self) -> None:
        if self.receiver is not None:
            self.receiver.should_stop = True
        self.thread.join(5)

    def task_events(self) -> int:
        """Events other than the workers' own (heartbeats): task events and the lock's."""
        return sum(n for kind, n in self.counts.items() if not kind.startswith("worker-"))


def burst(client: Any, lock: RedisServer, key: str, skips: int) -> int:
    """``skips`` calls of ``hold_skip`` on ``key`` with its lock held from here; the number of
    them skipped (their result's state is not SUCCESS)."""
    from tests.celery.tasks import policies

    name = policies.hold_skip.lock_options.keyer.name((key,), {})
    locker = RedisLocker(redis.Redis.from_url(lock.url))
    lease = locker.try_acquire(name, 120, owner=Owner(task_id="bench-holder"), renew=False)
    if not isinstance(lease, Lease):
        raise BenchError(f"the lock of {key!r} not acquired: {lease!r}")
    try:
        sent = [client.send_task(policies.hold_skip.name, args=[key]) for _ in range(skips)]
        for result in sent:
            result.get(timeout=120, propagate=False)
        return sum(1 for result in sent if result.state != "SUCCESS")
    finally:
        lease.release()


def run(skips: int) -> None:
    from tests.celery.workers import (
        CeleryWorkerProcess,
        Servers,
        client_app,
        close_client,
        unique,
    )

    with (
        RedisServer.running() as broker,
        RedisServer.running() as lock,
        RedisServer.running() as results,
    ):
        servers = Servers(broker_url=broker.url, lock=lock, backend_url=results.url)
        with worker_group(servers) as group:
            # heartbeats on: their events show that the receiver hears the worker
            worker = CeleryWorkerProcess(
                servers,
                queue=unique("q"),
                concurrency=CONCURRENCY,
                log_dir=group.log_dir,
                heartbeat=True,
            )
            group.workers.append(worker)
            worker.start()
            client = client_app(servers, worker.queue)
            events = EventCounts(client)
            try:
                time.sleep(5)  # the receiver subscribed; a heartbeat or two
                phases = [phase(client, lock, broker, worker, events, skips, turn_on=False)]
                client.control.enable_events(reply=True, timeout=5)
                phases.append(phase(client, lock, broker, worker, events, skips, turn_on=True))
                print("every event received, by type:", dict(events.counts))
            finally:
                events.close()
                close_client(client)
    off = phases[0]
    heard = events.counts["worker-heartbeat"]
    print(
        "verdicts (issue 29: no event sent for a skip with events off; one line per burst):",
        f"   events off, {off.skipped} skips: {off.events} task or lock events received"
        f" (0; the receiver heard {heard} heartbeats): "
        + ("meets" if off.events == 0 and heard else "MISSES"),
        f"   a burst of {off.skipped} skips of one key: {off.lines} WARNING lines"
        f" (<= 1 per pool child, {CONCURRENCY}): "
        + ("meets" if 1 <= off.lines <= CONCURRENCY else "MISSES"),
        sep="\n",
    )


@dataclass
class Phase:
    skipped: int
    events: int
    lines: int


def phase(
    client: Any,
    lock: RedisServer,
    broker: RedisServer,
    worker: Any,
    events: EventCounts,
    skips: int,
    *,
    turn_on: bool,
) -> Phase:
    """One burst of ``skips`` skips of a fresh key: what reached the receiver, the broker's
    PUBLISH calls and the skip lines logged."""
    from tests.celery.workers import unique

    counters = broker.client()
    before_events = events.task_events()
    before_lines = worker.count_in_log(SKIP_LINE)
    counters.config_resetstat()
    skipped = burst(client, lock, unique("hot"), skips)
    time.sleep(2)  # events and log lines still in flight
    publish = counters.info("commandstats").get("cmdstat_publish", {}).get("calls", 0)
    result = Phase(
        skipped,
        events.task_events() - before_events,
        worker.count_in_log(SKIP_LINE) - before_lines,
    )
    print(
        f"events {'on' if turn_on else 'off'}: {skips} calls of one held key,"
        f" {result.skipped} skipped; task and lock events received {result.events};"
        f" PUBLISH on the broker server {publish}; skip WARNING lines {result.lines}"
    )
    return result


def parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    return sized_options(__name__, __doc__, argv, "skips", (50, 200))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(argv)
    print(versions("celery", "redis"))
    run(args.skips)
    return 0
