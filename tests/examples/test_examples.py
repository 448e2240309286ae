"""The examples, run the way a reader runs them (``python -m examples.X``), at a reduced size.

Each runner starts real ``celery worker``/``celery beat`` subprocesses against a throwaway
redis-server, and its invariants are checked twice: from its exit code and from the JSON line
it prints last. About 30 s in all.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from celery_singleton_lock.testing import RedisServer

ROOT = Path(__file__).resolve().parents[2]

# Server settings a developer may have exported; the tests pass --redis-url only.
SERVER_ENV = (
    "REDIS_URL",
    "CELERY_BROKER_URL",
    "CELERY_RESULT_BACKEND",
    "SINGLETON_LOCK_URL",
    "EXAMPLE_DATA_URL",
    "EXAMPLE_NAMESPACE",
)


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with RedisServer.running() as server:
        yield server.url


def run_example(module: str, *args: str, timeout: float) -> tuple[int, dict[str, Any], str]:
    """Run ``python -m module args``; return its exit code, last JSON line and whole output."""
    env = {k: v for k, v in os.environ.items() if k not in SERVER_ENV}
    process = subprocess.Popen(
        [sys.executable, "-m", module, *args, "--no-progress"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    timed_out = False
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        out, err = "", ""
    finally:
        if process.poll() is None:
            # SIGTERM: the runner stops its workers and beats (bounded), then exits
            process.send_signal(signal.SIGTERM)
            try:
                more_out, more_err = process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                more_out, more_err = process.communicate(timeout=10)
            out, err = out + more_out, err + more_err
    output = f"--- stdout ---\n{out}\n--- stderr ---\n{err}"
    if timed_out:
        pytest.fail(f"{module} did not finish within {timeout}s\n{output}")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"{module} printed no JSON summary\n{output}"
    return process.returncode, json.loads(lines[-1]), output


@pytest.mark.timeout(150)
def test_beat_two_beats_two_workers_never_overlap(redis_url: str) -> None:
    code, summary, output = run_example(
        "examples.beat_singleton", "--seconds", "12", "--redis-url", redis_url, timeout=90
    )
    assert code == 0, output
    assert summary["ok"] is True, output
    assert summary["overlaps"] == 0, output  # from the recorded start/end times
    assert summary["overlaps_seen"] == 0, output  # from the in-body gauge
    # a ~5 s job, ticks every 2 s from each of 2 beats for 12 s: 2 runs, the rest skipped
    assert summary["runs"] >= 2, output
    assert summary["completed"] == summary["runs"], output
    assert summary["skipped"] >= 1, output
    # the logs account for every skip but the last burst's (one WARNING per burst of a key)
    assert summary["skipped"] <= summary["skipped_signal"], output
    assert "is held by task" in output and "skipped: lock" in output, output
    # skipping does not starve the job: the next tick after a release runs it
    assert summary["longest_gap_s"] is not None and summary["longest_gap_s"] < 5.0, output


@pytest.mark.timeout(150)
def test_balances_exact_with_lock_and_lossy_without(redis_url: str) -> None:
    code, report, output = run_example(
        "examples.balances",
        "--accounts",
        "4",
        "--updates",
        "120",
        "--seed",
        "7",
        "--redis-url",
        redis_url,
        timeout=90,
    )
    assert code == 0, output
    # with LockedTask (lock_on=account_id, fencing): every update applied exactly once
    assert report["exact"] is True, output
    assert report["lost"] == 0, output
    assert report["doubled"] == 0, output
    assert report["missing"] == 0, output
    assert report["failed"] == 0, output
    assert report["wrong_accounts"] == 0, output
    assert report["expected_total"] == report["actual_total"], output
    assert report["rejected_writes"] == 0, output  # no lock was lost, so no write was fenced
    assert report["parked"] >= 1, output  # updates of one account did collide, and queued
    # the same workload on a plain Task: everything ran, but concurrent read-modify-writes of
    # one account overwrote each other (~30 of 120 here; 0 would need no two updates of an
    # account to ever overlap across 6 slots)
    plain = report["plain"]
    assert plain["missing"] == 0 and plain["failed"] == 0, output
    assert plain["doubled"] == 0, output
    assert plain["lost"] >= 1, output
