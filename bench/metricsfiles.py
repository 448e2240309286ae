"""Prometheus multiprocess files of recycled pool children (issue 29): the folder's size and
what a scrape costs.

A real prefork worker of ``tests/celery/metricsapp.py`` (``singleton_lock_metrics`` on, served
on a free port, its multiprocess folder a fresh one of the bench's), ``-c 2
--max-tasks-per-child 10``: ``--tasks`` (1,200) calls of ``hold_skip`` on distinct keys, sent at
once. At the end: the files in the folder against the worker's live processes (main process and
pool children), then ``--scrapes`` (20) scrapes of ``/metrics`` (wall ms, median and quartiles:
the HTTP round trip, the merge of any dead child's files and the reading of the folder) and the
acquires they count (every task's must be there: a dead child's counts are kept).

    python -m bench metricsfiles         # ~1-2 min (--quick ~30 s)
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import urllib.request
from typing import Dict, Optional, Sequence, Tuple

from celery_singleton_lock.testing import RedisServer

from ._common import sized_options, versions, worker_group

CONCURRENCY = 2
#: the most files the folder may hold with the worker's live processes (main + pool): 2 each,
#: the archive of each metric type (counter, histogram) and the merge lock
BOUND = 2 * (1 + CONCURRENCY) + 2 + 1


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        return str(response.read().decode())


def acquired(text: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("celery_lock_acquired_total{")
    )


def files_by_kind(directory: str) -> Dict[str, int]:
    kinds: Dict[str, int] = {}
    for name in os.listdir(directory):
        kind = name.split("_", 1)[0] if name.endswith(".db") else name
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def run(tasks: int, scrapes: int, per_child: int) -> None:
    from tests.celery.tasks import policies
    from tests.celery.workers import MetricsServers, children_of, client_app, close_client, unique

    with (
        tempfile.TemporaryDirectory(prefix="bench-metricsfiles-") as directory,
        RedisServer.running() as server,
    ):
        servers = MetricsServers.of(server, server, directory)
        with worker_group(servers) as group:
            (worker,) = group.start(
                concurrency=CONCURRENCY, extra_args=["--max-tasks-per-child", str(per_child)]
            )
            client = client_app(servers, worker.queue)
            try:
                first = timed_scrape(servers.metrics_port)[0]  # the worker's first: warm-up
                started = time.monotonic()
                sent = [
                    client.send_task(policies.hold_skip.name, args=[unique("k")])
                    for _ in range(tasks)
                ]
                # sampled while the tasks run: the most files and the files per live process
                most, most_ratio = 0, 0.0
                pids = set()
                for result in sent:
                    while not result.ready():
                        files = len(os.listdir(directory))
                        live_now = 1 + len(children_of(worker.pid))
                        most, most_ratio = max(most, files), max(most_ratio, files / live_now)
                        time.sleep(0.2)
                    pids.add(result.get(timeout=300)["pid"])
                ran_s = time.monotonic() - started
                deadline = time.monotonic() + 10
                while len(children_of(worker.pid)) < 2 and time.monotonic() < deadline:
                    time.sleep(0.1)  # the last recycled child's replacement
                live = 1 + len(children_of(worker.pid))
                at_end = files_by_kind(directory)
                names = sorted(os.listdir(directory))
                scraped = [timed_scrape(servers.metrics_port) for _ in range(scrapes)]
            finally:
                close_client(client)
    times = [ms for ms, _ in scraped]
    counted = acquired(scraped[-1][1])
    quartiles = statistics.quantiles(times, n=4)
    files = sum(at_end.values())
    print(
        f"{tasks:,} tasks in {ran_s:.1f} s, run by {len(pids)} pool children"
        f" (-c 2, --max-tasks-per-child {per_child})"
    )
    print(
        f"files at the end: {files} {names}; live processes {live}"
        f" (main + {live - 1} children): {files / live:.1f} per live process"
    )
    print(
        f"while running (sampled every 0.2 s): at most {most} files,"
        f" at most {most_ratio:.1f} per live process"
    )
    print(
        f"scrape wall ms: median {statistics.median(times):.1f}"
        f" [IQR {quartiles[0]:.1f}..{quartiles[2]:.1f}] over {scrapes};"
        f" the worker's first scrape (before any task) {first:.1f}"
    )
    print(
        "verdicts (issue 29: dead children's files merged and removed):",
        f"   about 2 files per live process: at most {most} files at any time"
        f" (<= {BOUND}: 2 per live process, the 2 archives and the lock): "
        + ("meets" if most <= BOUND else "MISSES"),
        f"   acquires counted {counted:.0f} of {tasks} (a dead child's counts kept): "
        + ("meets" if counted == tasks else "MISSES"),
        sep="\n",
    )


def timed_scrape(port: int) -> Tuple[float, str]:
    """Wall ms of one scrape of ``/metrics`` and its text."""
    started = time.perf_counter()
    text = scrape(port)
    return (time.perf_counter() - started) * 1000, text


def parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    scrapes = ("scrapes", 20, "scrapes timed")
    per_child = ("max-tasks-per-child", 10, "the worker's option")
    return sized_options(__name__, __doc__, argv, "tasks", (300, 1200), scrapes, per_child)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(argv)
    print(versions("celery", "redis", "prometheus_client"))
    run(args.tasks, args.scrapes, args.max_tasks_per_child)
    print(os.popen("uptime").read().strip())
    return 0
