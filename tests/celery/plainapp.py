"""An app that takes no locks of this package: plain tasks and celery-singleton's own
``Singleton``, configured with every celery-singleton setting (tests/celery/test_plain_app.py).

celery-singleton-lock is installed (the ``celery`` command loads its light ``locks`` group, a
``celery.commands`` entry point, which imports none of the Celery layer), and this app even
imports the Celery layer itself, whose import connects the worker-side signal receivers: with
no locked task declared, they must leave the app alone. The app also
names a lock server of ours (``singleton_lock_url``): the tests read from that server that no
worker ever connected to it.

Configured by :func:`configure` in the test process, or from the ``CSL_*`` environment
variables in a ``celery worker`` subprocess. With ``CSL_REPORT`` set, the worker writes what
can only be seen from inside it, once it is ready: its threads, the worker bootsteps, whether
this package was imported; and every record of this package's loggers goes to
``CSL_REPORT + ".ours.log"`` (empty when the package said nothing).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from typing import Any

import redis
from celery import Celery, signals
from celery_singleton import Singleton

import celery_singleton_lock.celery  # noqa: F401  (connects our receivers; no LockedTask here)
from tests.support import broker_polling

app = Celery("plainapp")

#: seconds a gated body waits at most for its gate
GATE_TIMEOUT = 30


def configure(
    *, broker_url: str, backend_url: str, lock_url: str, singleton_url: str, queue: str
) -> None:
    app.conf.update(
        broker_url=broker_url,
        result_backend=backend_url,
        broker_connection_retry_on_startup=True,
        broker_transport_options=broker_polling(),
        task_default_queue=queue,
        # ours, naming a server this app must never reach
        singleton_lock_url=lock_url,
        # a misspelling of ours, which the worker-start check refuses in an app that takes
        # locks: here there is no check
        singleton_lock_tll=5,
        # celery-singleton's, every one: none of them is a misspelling of ours
        singleton_backend_url=singleton_url,
        singleton_key_prefix="plainapp-singleton:",
        singleton_lock_expiry=60,
        singleton_raise_on_duplicate=False,
        singleton_backend_class="celery_singleton.backends.redis.RedisBackend",
        singleton_backend_kwargs={},
        singleton_json_encoder_class="json.JSONEncoder",
    )


if os.environ.get("CSL_BROKER_URL"):
    configure(
        broker_url=os.environ["CSL_BROKER_URL"],
        backend_url=os.environ["CSL_BACKEND_URL"],
        lock_url=os.environ["CSL_LOCK_URL"],
        singleton_url=os.environ["CSL_SINGLETON_URL"],
        queue=os.environ["CSL_QUEUE"],
    )


@app.task(name="plain.add", shared=False)
def add(a: int, b: int) -> int:
    return a + b


@app.task(name="plain.gated_add", base=Singleton, shared=False)
def gated_add(a: int, b: int, gate: str) -> int:
    """Returns once the test pushes to ``gate`` (so a duplicate is sent while it is queued
    or running), or after GATE_TIMEOUT."""
    client = redis.Redis.from_url(app.conf.broker_url)
    try:
        client.blpop([gate], timeout=GATE_TIMEOUT)
    finally:
        client.close()
    return a + b


_REPORT = os.environ.get("CSL_REPORT")
if _REPORT:
    _ours = logging.getLogger("celery_singleton_lock")
    _ours.addHandler(logging.FileHandler(_REPORT + ".ours.log"))
    _ours.setLevel(logging.DEBUG)

    # Connected after this package's receivers (the celery command imported it before this
    # module), so it sees whatever those started.
    @signals.worker_ready.connect(weak=False)
    def _report(sender: Any = None, **_: Any) -> None:
        controller = getattr(sender, "controller", None)
        blueprint = getattr(controller, "blueprint", None)
        steps = [step.name for step in getattr(blueprint, "steps", {}).values()]
        steps += [f"{step.__module__}.{step.__qualname__}" for step in app.steps["worker"]]
        with open(str(_REPORT), "w") as f:
            json.dump(
                {
                    "threads": sorted(thread.name for thread in threading.enumerate()),
                    "steps": sorted(steps),
                    "ours_imported": "celery_singleton_lock.celery.worker.wiring" in sys.modules,
                },
                f,
            )
