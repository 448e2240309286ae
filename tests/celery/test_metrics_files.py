"""The metrics directory of a real prefork worker that recycles its pool children
(``--max-tasks-per-child 2``, -c 2): the files of a child that exits are merged into the archive
and removed, so the directory holds about 2 files per live process, and the scraped totals are
the same before and after a merge.

One scenario per module: 30 calls of 30 keys (15 children forked and recycled), then a child
that has run one call is killed with SIGKILL (no chance to merge its own files: the scrape
merges them).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator

import pytest

from celery_singleton_lock.celery.worker.reclaim import pid_is_gone
from celery_singleton_lock.testing import RedisServer
from tests.celery.tasks import policies
from tests.celery.test_metrics import metrics_worker, scrape, scrape_once_released, total
from tests.celery.workers import unique
from tests.support import wait_until

pytest.importorskip("prometheus_client")

TASK = policies.hold_skip.name
CALLS = 30
CONCURRENCY = 2
#: the lock metrics have no gauge: a process has at most its counter and histogram files
FILES_PER_PROCESS = 2


def pid_of(file_name: str) -> str:
    return file_name[: -len(".db")].rsplit("_", 1)[-1]


def db_files(directory: str) -> list[str]:
    return sorted(entry for entry in os.listdir(directory) if entry.endswith(".db"))


def process_files(directory: str) -> list[str]:
    """The files of processes, the archive left out."""
    return [entry for entry in db_files(directory) if pid_of(entry).isdigit()]


def only_live_files(directory: str) -> bool:
    """True once every process file names a live process (the pool children exit after their
    second call, and merge their files on their way out); also when there is none (the
    children alive then had counted nothing yet)."""
    return not any(pid_is_gone(int(pid_of(entry))) for entry in process_files(directory))


@dataclass
class Outcome:
    body_pids: set[int]
    #: the process files once the recycled children were gone
    files_after_recycling: list[str]
    after_recycling: dict[Any, float]
    #: a pool child that had run one call (so was not on its way out), killed with SIGKILL
    killed: int
    #: its files before the kill
    files_of_killed: list[str]
    before_kill: dict[Any, float]
    after_kill: dict[Any, float]
    #: the directory after the scrape that followed the kill
    files_after_kill: list[str]


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outcome]:
    directory = str(tmp_path_factory.mktemp("metrics"))
    recycling = ("--max-tasks-per-child", "2")
    with (
        RedisServer.running() as server,
        metrics_worker(server, server, directory, CONCURRENCY, recycling) as (_, client, port),
    ):
        ran = [client.send_task(TASK, args=[unique("recycled")]) for _ in range(CALLS)]
        calls_by_pid = Counter(result.get(timeout=60)["pid"] for result in ran)
        try:
            wait_until(lambda: only_live_files(directory), timeout=20)
        except AssertionError:
            left = process_files(directory)
            raise AssertionError(f"files of processes that are gone are left: {left}") from None
        files = process_files(directory)
        body_pids = set(calls_by_pid)
        after_recycling = scrape_once_released(port, acquires=CALLS)

        def a_child_after_one_call() -> int:
            # its first call: a child after its second is on its way out (merging its files)
            pid = int(client.send_task(TASK, args=[unique("killed")]).get(timeout=30)["pid"])
            calls_by_pid[pid] += 1
            return pid if calls_by_pid[pid] == 1 else 0

        victim = wait_until(a_child_after_one_call, timeout=30)
        before = scrape_once_released(port, acquires=sum(calls_by_pid.values()))
        victim_files = [entry for entry in process_files(directory) if pid_of(entry) == str(victim)]
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: pid_is_gone(victim), timeout=20)
        after = scrape(port)
        yield Outcome(
            body_pids,
            files,
            after_recycling,
            victim,
            victim_files,
            before,
            after,
            db_files(directory),
        )


def test_the_calls_ran_in_many_recycled_pool_children(outcome: Outcome) -> None:
    assert len(outcome.body_pids) >= CALLS // 2


def test_the_directory_holds_two_files_per_live_process_after_recycling(
    outcome: Outcome,
) -> None:
    live_processes = 1 + CONCURRENCY  # the main process and its pool
    assert len(outcome.files_after_recycling) <= FILES_PER_PROCESS * live_processes


def test_the_scraped_acquires_equal_the_calls_of_every_recycled_child(outcome: Outcome) -> None:
    assert total(outcome.after_recycling, "celery_lock_acquired_total", name=TASK) == CALLS


def test_the_lock_histograms_keep_the_counts_of_recycled_children(outcome: Outcome) -> None:
    for histogram in ("celery_lock_acquire_seconds_count", "celery_lock_held_seconds_count"):
        assert total(outcome.after_recycling, histogram, name=TASK) == CALLS


def test_a_scrape_merges_and_removes_the_files_of_a_killed_child(outcome: Outcome) -> None:
    assert outcome.files_of_killed  # it had counted its call
    killed = str(outcome.killed)
    assert killed not in {pid_of(entry) for entry in outcome.files_after_kill}


def test_the_scraped_totals_are_the_same_after_a_killed_child_is_merged(
    outcome: Outcome,
) -> None:
    def lock_samples(samples: dict[Any, float]) -> dict[Any, float]:
        return {
            key: value
            for key, value in samples.items()
            if key[0].startswith("celery_lock_") and not key[0].endswith("_created")
        }

    assert lock_samples(outcome.after_kill) == lock_samples(outcome.before_kill)


# -- the merge itself, on files written here ----------------------------------------------


def a_dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def write_counts_of_three_processes(directory: str) -> int:
    """Counter and histogram files of this process and of two dead ones; returns this pid."""
    from prometheus_client.mmap_dict import MmapedDict, mmap_key

    from celery_singleton_lock.celery.observe.process_files import TIMESTAMPED

    def write(kind: str, pid: int, samples: dict[tuple[str, str], float]) -> None:
        counts = MmapedDict(os.path.join(directory, f"{kind}_{pid}.db"))
        for (name, le), value in samples.items():
            labels = ["name", "le"] if le else ["name"]
            values = ["t", le] if le else ["t"]
            key = mmap_key(f"m_{kind}", name, labels, values, "help")
            counts.write_value(key, value, *((0.0,) if TIMESTAMPED else ()))
        counts.close()

    live = os.getpid()
    for n, pid in enumerate([live, a_dead_pid(), a_dead_pid()], start=1):
        write("counter", pid, {("m_counter_total", ""): n})
        write(
            "histogram",
            pid,
            {
                ("m_histogram_bucket", "0.1"): n,
                ("m_histogram_bucket", "+Inf"): 1,
                ("m_histogram_sum", ""): 0.05 * n,
            },
        )
    return live


def totals(metrics: Any) -> dict[Any, float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): round(s.value, 9)
        for metric in metrics
        for s in metric.samples
    }


def unmerged_totals(directory: str) -> dict[Any, float]:
    from prometheus_client import multiprocess

    files = [os.path.join(directory, entry) for entry in db_files(directory)]
    return totals(multiprocess.MultiProcessCollector.merge(files))


def test_a_merge_keeps_every_total_and_leaves_the_archive_and_the_live_files(
    tmp_path: Any,
) -> None:
    from celery_singleton_lock.celery.observe.process_files import MergingCollector, own

    directory = str(tmp_path)
    own(directory)
    live = write_counts_of_three_processes(directory)
    unmerged = unmerged_totals(directory)
    assert totals(MergingCollector(None, directory).collect()) == unmerged
    assert db_files(directory) == sorted(
        [f"counter_{live}.db", "counter_archive.db", f"histogram_{live}.db", "histogram_archive.db"]
    )
    assert totals(MergingCollector(None, directory).collect()) == unmerged


def test_a_directory_the_worker_does_not_own_is_read_and_left_as_it_is(tmp_path: Any) -> None:
    from celery_singleton_lock.celery.observe.process_files import MergingCollector

    directory = str(tmp_path)
    write_counts_of_three_processes(directory)
    files, unmerged = db_files(directory), unmerged_totals(directory)
    assert totals(MergingCollector(None, directory).collect()) == unmerged
    assert db_files(directory) == files


def test_a_child_forked_while_a_scrape_runs_can_still_merge_its_files_at_exit(
    tmp_path: Any,
) -> None:
    """A child forked while the scrape held the merge lock shared its open file (a ``flock``
    belongs to the open file, not to the process): the lock stayed held for the child's life,
    and the child hung at its exit, waiting for it."""
    from celery_singleton_lock.celery.observe.process_files import MergingCollector, own, retire

    directory = str(tmp_path)
    own(directory)
    write_counts_of_three_processes(directory)
    scraping = threading.Event()
    scraping.set()

    def scrape_again_and_again() -> None:
        while scraping.is_set():
            MergingCollector(None, directory).collect()

    scraper = threading.Thread(target=scrape_again_and_again, daemon=True)
    scraper.start()
    try:
        children = []
        for _ in range(20):
            pid = os.fork()
            if pid == 0:  # the child: merge its (no) files as a pool child does at its exit
                try:
                    retire(directory, os.getpid())
                finally:
                    os._exit(0)
            children.append(pid)
        deadline = time.monotonic() + 10
        while children and time.monotonic() < deadline:
            children = [pid for pid in children if os.waitpid(pid, os.WNOHANG) == (0, 0)]
            time.sleep(0.05)
        for pid in children:  # hung: do not leave them behind
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        assert not children
    finally:
        scraping.clear()
        scraper.join(5)
