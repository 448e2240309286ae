"""The quickstart, as it stands: the file (the docs' first tutorial includes it whole, the
README shows an excerpt), a real `celery -A tasks worker` started in its directory as both say,
and the calls they show."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from celery import Celery

from celery_singleton_lock import DuplicateTaskSkipped
from celery_singleton_lock.testing import RedisServer

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart"


def is_excerpt(shown: list[str], source: list[str]) -> bool:
    """Every line of ``shown`` is a line of ``source``, in the same order."""
    remaining = iter(source)
    return all(line in remaining for line in shown)


def test_the_readme_quickstart_is_an_excerpt_of_the_quickstart_file() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Quickstart") :]
    shown = re.search(r"```python\n(.*?)```", section, re.S)
    assert shown is not None
    assert "def rebuild_report(day):" in shown.group(1)
    source = (QUICKSTART / "tasks.py").read_text().splitlines()
    assert is_excerpt(shown.group(1).splitlines(), source)


def test_the_tutorial_includes_the_quickstart_file_whole() -> None:
    tutorial = (ROOT / "docs" / "tutorial" / "first-locked-task.md").read_text()
    assert '```python\n--8<-- "examples/quickstart/tasks.py"\n```' in tutorial


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Celery, Path]]:
    """A worker started as the docs say, on a throwaway Redis; a client app of that Redis."""
    db = tmp_path_factory.mktemp("quickstart") / "balances.sqlite3"
    with RedisServer.running() as server:
        env = {**os.environ, "REDIS_URL": server.url, "QUICKSTART_DB": str(db)}
        log = db.with_suffix(".log")
        with open(log, "wb") as out:
            worker = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "tasks", "worker", "--loglevel", "INFO"],
                cwd=QUICKSTART,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + 45
            while b"ready." not in log.read_bytes():
                assert worker.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            client = Celery("client", broker=server.url, backend=server.url)
            yield client, db
        finally:
            worker.terminate()
            try:
                worker.wait(15)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(5)


def test_a_second_report_for_the_same_day_is_skipped_while_the_first_runs(
    quickstart: tuple[Celery, Path],
) -> None:
    client, _ = quickstart
    first = client.send_task("tasks.rebuild_report", ("2026-11-23",))
    time.sleep(0.5)
    second = client.send_task("tasks.rebuild_report", ("2026-11-23",))
    with pytest.raises(DuplicateTaskSkipped):
        second.get(timeout=20)
    assert first.get(timeout=20) == "report for 2026-11-23"


def test_balance_updates_for_one_account_all_apply_with_increasing_fences(
    quickstart: tuple[Celery, Path],
) -> None:
    client, db = quickstart
    results: list[Any] = [client.send_task("tasks.apply_delta", ("acct-1", 100)) for _ in range(10)]
    for result in results:
        result.get(timeout=60)
    with sqlite3.connect(db) as store:
        cents, fence = store.execute(
            "SELECT cents, fence FROM balances WHERE account_id = 'acct-1'"
        ).fetchone()
    assert (cents, fence) == (1000, 10)
