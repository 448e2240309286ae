"""Trace events in a process with no tracer provider (the OpenTelemetry API alone, installed
as another package's dependency): no span can record there, so its first lock disconnects
the receivers and later tasks pay nothing. Each case runs in a fresh interpreter: a tracer
provider, once set, stays for the life of a process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from celery_singleton_lock.testing import RedisServer

pytest.importorskip("opentelemetry.trace")
pytest.importorskip("opentelemetry.sdk.trace")

SCRIPT = """
from celery import Celery
from celery_singleton_lock import LockedTask
from celery_singleton_lock.celery.observe import tracing
from celery_singleton_lock.celery.signals import lock_acquired

if {with_provider}:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    trace.set_tracer_provider(TracerProvider())

app = Celery("idle", broker="memory://", set_as_current=False)
app.conf.singleton_lock_url = "{url}"

@app.task(base=LockedTask, shared=False)
def job(x):
    return x

assert tracing.connect(app.conf)
before = len(lock_acquired.receivers)
job.apply(args=(1,), task_id="t-1").get()
job.apply(args=(2,), task_id="t-2").get()
print(before, len(lock_acquired.receivers))
"""


def receivers_before_and_after(redis_server: RedisServer, *, with_provider: bool) -> list[int]:
    script = SCRIPT.format(url=redis_server.url, with_provider=with_provider)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [int(count) for count in done.stdout.split()]


def test_without_a_tracer_provider_the_first_lock_disconnects_the_trace_receivers(
    redis_server: RedisServer,
) -> None:
    before, after = receivers_before_and_after(redis_server, with_provider=False)
    assert before == 2  # the trace events' and the lock timing's
    assert after == 0


def test_with_a_tracer_provider_the_trace_receivers_stay(redis_server: RedisServer) -> None:
    before, after = receivers_before_and_after(redis_server, with_provider=True)
    assert before == after == 2
