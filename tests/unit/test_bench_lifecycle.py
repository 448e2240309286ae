"""``python -m bench lifecycle`` traces a call of each shape on a real Redis. It runs in a
process of its own: it registers tasks, makes lockers and drives the process's renewer, which
the tests that follow in this process must not inherit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from celery_singleton_lock.testing import RedisServer

REPO = Path(__file__).resolve().parents[2]


def test_a_traced_call_passes_through_the_engine_and_the_celery_layer() -> None:
    with RedisServer.running() as server:
        environ = {**os.environ, "REDIS_URL": server.url}
        environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(REPO), environ.get("PYTHONPATH")])
        )
        run = subprocess.run(
            [sys.executable, "-m", "bench", "lifecycle", "--functions"],
            cwd=REPO,
            env=environ,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert run.returncode == 0, run.stderr
    assert "celery.task.locked_task: " in run.stdout and "before_start" in run.stdout
    assert "engine.server_leases: " in run.stdout
    assert "skip: " in run.stdout and "queue: " in run.stdout and "limit3: " in run.stdout
