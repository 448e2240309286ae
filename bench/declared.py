"""Every key a script touches is passed in its ``KEYS`` (issue 29), watched under a real worker.

Not a timing: a real prefork worker of ``tests/celery/lockapp.py`` (``-c 2``) runs a mix of
policies on a private lock server (skip, wait, queue, an ``acks_late`` queue, ``lock_limit=3``,
``lock_rate``, ``lock_cooldown``, fenced, fail; several calls of one key each, so that
duplicates park, wait, are handed on and skipped) while ``MONITOR`` records every command the
server runs. Each command a script ran (``[0 lua]`` in ``MONITOR``) has its keys told by the
server (``COMMAND GETKEYS``) and checked against the ``KEYS`` of the ``EVALSHA``/``EVAL`` that
ran it (a script runs whole, so its commands follow its call). What Redis Cluster proxies that
route by ``KEYS`` and Dragonfly require. ``tests/engine/test_shared_keys.py`` pins the same for
the finish-record scripts, engine level.

    python -m bench declared             # ~20 s
"""

from __future__ import annotations

import argparse
import collections
import re
import threading
import time
from typing import Any, List, Optional, Sequence, Tuple

import redis

from celery_singleton_lock.testing import RedisServer

from ._common import BenchError, versions, worker_group

#: A MONITOR line: '<time> [<db> <client address, or lua>] "<arg>" "<arg>" ...'
MONITOR_LINE = re.compile(r"^[\d.]+ \[\d+ (\S+)\] (.*)$")
MONITOR_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')
SCRIPT_CALLS = ("EVALSHA", "EVAL", "EVALSHA_RO", "EVAL_RO")


class Monitor:
    """Every line ``MONITOR`` gives of one server, read in a thread until :meth:`close`."""

    def __init__(self, url: str) -> None:
        self.lines: List[str] = []
        self.client = redis.Redis.from_url(url, socket_timeout=None)  # quiet while workers start
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        self.started.wait(10)

    def _read(self) -> None:
        with self.client.monitor() as monitor:
            self.started.set()
            while True:
                try:
                    line = monitor.connection.read_response()
                except (redis.ConnectionError, OSError, ValueError):  # closed by close()
                    return
                self.lines.append(_text(line))

    def close(self) -> None:
        self.client.connection_pool.disconnect()
        self.thread.join(5)


def send_mix(client: Any) -> List[Any]:
    """The calls of every policy, several on one key each; their results."""
    from tests.celery.tasks import limits, policies, queueing, runtime
    from tests.celery.workers import unique

    short = {"seconds": 0.05}
    calls: List[Tuple[str, List[Any], int]] = [
        (policies.hold_skip.name, [unique("skip")], 10),
        (policies.hold_wait.name, [unique("wait")], 5),
        (queueing.hold_queue.name, [unique("queue")], 8),
        (limits.limit3_skip.name, [unique("limit3")], 6),
        (limits.rate3_queue.name, [unique("rate")], 5),
        (limits.cooldown1_queue.name, [unique("cooldown")], 3),
        (policies.hold_fail.name, [unique("fail")], 2),
    ]
    sent = [
        client.send_task(name, args=args, kwargs=short)
        for name, args, times in calls
        for _ in range(times)
    ]
    key = unique("late")
    sent += [
        client.send_task(queueing.queued_acks_late.name, args=[key, i], kwargs=short)
        for i in range(6)
    ]
    sent += [client.send_task(runtime.fenced.name, args=[unique("fenced")]) for _ in range(3)]
    return sent


Outside = List[Tuple[List[str], str]]


def undeclared(
    lines: Sequence[str], server: redis.Redis
) -> Tuple[collections.Counter[str], int, Outside]:
    """Script calls by command, commands run by scripts, and the keys they touched outside
    their script's ``KEYS``."""
    declared: set[str] = set()
    calls: collections.Counter[str] = collections.Counter()
    run_by_scripts = 0
    outside: Outside = []
    for line in lines:
        match = MONITOR_LINE.match(line)
        if match is None:
            continue
        source, command = match.groups()
        args = [arg.replace('\\"', '"') for arg in MONITOR_ARG.findall(command)]
        if not args:
            continue
        name = args[0].upper()
        if source != "lua":
            if name in SCRIPT_CALLS:
                declared = set(args[3 : 3 + int(args[2])])
                calls[name] += 1
            continue
        run_by_scripts += 1
        try:
            keys = server.command_getkeys(*args)
        except redis.ResponseError:  # TIME, PUBLISH, PUBSUB: no key
            keys = []
        outside += [(args[:3], key) for key in map(_text, keys) if key not in declared]
    return calls, run_by_scripts, outside


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench declared", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the same (it is small)")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parse(argv)
    from tests.celery.workers import Servers, client_app, close_client

    print(versions("celery", "redis"))
    with RedisServer.running() as broker, RedisServer.running() as lock:
        monitor = Monitor(lock.url)
        servers = Servers(broker_url=broker.url, lock=lock)
        with worker_group(servers) as group:
            (worker,) = group.start(concurrency=2)
            client = client_app(servers, worker.queue)
            try:
                sent = send_mix(client)
                for result in sent:
                    result.get(timeout=120, propagate=False)
                states = collections.Counter(result.state for result in sent)
            finally:
                close_client(client)
        time.sleep(0.5)  # the last lines
        monitor.close()
        calls, run_by_scripts, outside = undeclared(monitor.lines, lock.client())
    if not calls:
        raise BenchError(
            f"no script call seen among {len(monitor.lines)} lines: {monitor.lines[:3]}"
        )
    print(f"{len(sent)} calls through a prefork worker (-c 2), ended {dict(states)}")
    print(
        f"script calls {dict(calls)}; commands run by scripts {run_by_scripts:,};"
        f" keys touched outside their script's KEYS: {len(outside)} {outside[:5]}"
    )
    print(
        "verdict (issue 29: every key a script touches is in KEYS):",
        f"   {len(outside)} undeclared keys: " + ("meets" if not outside else "MISSES"),
        sep="\n",
    )
    return 0
