"""The metrics directory kept at about 2 files per live process: the counts of a process that
is gone are added into one archive file per metric type and its own files removed.

Why: prometheus_client's multiprocess mode gives every process files of its own
(``counter_<pid>.db``, ``histogram_<pid>.db``) and never removes them, and every scrape reads
them all. A prefork pool that recycles its children (``--max-tasks-per-child``) left 2 files per
child ever forked: 20,000 files made a scrape take 1.2 s.

Counters, histograms and summaries of a dead process must keep counting in the totals, so they
are not deleted (``multiprocess.mark_process_dead`` only removes live-mode gauges) but added,
key by key, into ``<type>_archive.db``: the same key (metric, sample, labels) that the
collector would have summed across processes, so a scrape's totals are the same before and
after. Histogram buckets are stored per bucket, not cumulated, so they add up the same way.

A merge replaces the archive, then removes the dead files: a reader between the two would count
them twice, and a counter that goes back down reads as a reset to Prometheus. So merges and
scrapes take one lock, a ``flock`` on ``merge.lock`` in the directory, across processes. That
file is made by the worker in a directory of its own (:func:`own`): a directory without it (a
``PROMETHEUS_MULTIPROC_DIR`` of the user's, read by their own collector, which takes no lock) is
read as it is, and nothing in it is merged.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import inspect
import os
import shutil
from typing import Any, Iterator

from prometheus_client import multiprocess
from prometheus_client.mmap_dict import MmapedDict

from celery_singleton_lock.celery.worker.reclaim import pid_is_gone
from celery_singleton_lock.engine import no_fork

#: metric types whose values add up across processes (gauges do not: see the module docstring)
ADDED_TYPES = ("counter", "histogram", "summary")
ARCHIVE = "archive"
LOCK_FILE = "merge.lock"
#: prometheus_client writes a timestamp beside each value from 0.18 on (the declared floor is
#: 0.17: entries of (key, value, pos), ``read_value`` a float, ``write_value`` without one)
TIMESTAMPED = "timestamp" in inspect.signature(MmapedDict.write_value).parameters


def own(directory: str) -> None:
    """Merge the files of dead processes in ``directory`` from now on (the worker's own)."""
    open(os.path.join(directory, LOCK_FILE), "a").close()


def _owned(directory: str) -> bool:
    return os.path.exists(os.path.join(directory, LOCK_FILE))


@contextlib.contextmanager
def merge_lock(directory: str) -> Iterator[None]:
    """Held while the directory is merged into the archive or read for a scrape."""
    with open(os.path.join(directory, LOCK_FILE), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def retire(directory: str, pid: int) -> None:
    """Add the counts of process ``pid``, which counts no more, into the archive and remove
    its files (a pool child at its exit); nothing in a directory not :func:`own`."""
    if not _owned(directory):
        return
    with merge_lock(directory):
        _merge(directory, pid)


def _merge(directory: str, pid: int) -> None:
    for kind in ADDED_TYPES:
        path = os.path.join(directory, f"{kind}_{pid}.db")
        try:
            counted = list(MmapedDict.read_all_values_from_file(path))  # type: ignore[no-untyped-call]
        except FileNotFoundError:
            continue
        # the sums go to a copy, which replaces the archive in one rename: a process killed
        # mid-merge leaves the archive as it was, not half added (then added again)
        archive = os.path.join(directory, f"{kind}_{ARCHIVE}.db")
        draft = f"{archive}.draft"  # not a .db: never read
        if os.path.exists(archive):
            shutil.copyfile(archive, draft)
        else:
            open(draft, "wb").close()
        sums = MmapedDict(draft)  # type: ignore[no-untyped-call]
        try:
            for key, value, *rest in counted:
                archived = sums.read_value(key)  # type: ignore[no-untyped-call]
                if TIMESTAMPED:  # rest: (timestamp, pos); read_value: (value, timestamp)
                    sums.write_value(key, archived[0] + value, rest[0])  # type: ignore[no-untyped-call]
                else:  # rest: (pos,); read_value: the value
                    sums.write_value(key, archived + value)  # type: ignore[call-arg,no-untyped-call]
        finally:
            sums.close()  # type: ignore[no-untyped-call]
        os.replace(draft, archive)
        os.unlink(path)
    multiprocess.mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]


def _pids(directory: str) -> set[int]:
    """The processes that have files in ``directory`` (``<type>[_<mode>]_<pid>.db``)."""
    stems = (os.path.basename(path)[:-3] for path in glob.glob(os.path.join(directory, "*.db")))
    return {int(pid) for pid in (stem.rsplit("_", 1)[-1] for stem in stems) if pid.isdigit()}


class MergingCollector(multiprocess.MultiProcessCollector):
    """Every process's counts in the directory, as prometheus_client's
    ``MultiProcessCollector`` reads them; in a directory of the worker's own, after merging the
    files of the processes that are gone (a child killed by ``SIGKILL`` had no chance to merge
    its own), under the merge lock, so a scrape never reads a half-merged directory."""

    def collect(self) -> Any:
        directory = self._path
        if not _owned(directory):
            return super().collect()  # type: ignore[no-untyped-call]
        # no fork while the lock is held: a pool child forked meanwhile would share the lock's
        # open file (flock belongs to it, not to a process) and keep it held for its lifetime,
        # and hang at its exit waiting for it (seen: every later scrape timed out)
        with no_fork, merge_lock(directory):
            for pid in _pids(directory):
                if pid_is_gone(pid):
                    _merge(directory, pid)
            return super().collect()  # type: ignore[no-untyped-call]
