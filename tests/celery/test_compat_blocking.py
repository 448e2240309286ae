"""celery-once's ``blocking`` setting, side by side with the original (as
test_compat_side_by_side.py), on a real worker of tests/celery/compatblockingapp.py: a duplicate
sent while the first call runs waits for it to end, then is published and runs; it is not
refused with ``AlreadyQueued``."""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

import pytest

pytest.importorskip("celery_singleton")

from celery_singleton_lock.celery.config.lockers import forget_locker
from tests.celery import compat_side, compatapp, compatblockingapp
from tests.celery.compat_side import needs_celery_once, running
from tests.celery.test_enqueue_dedupe import published
from tests.celery.workers import Servers
from tests.support import wait_until

pytestmark = needs_celery_once

# the shared fixtures, by name
queue = compat_side.queue
impl, key = compat_side.impl, compat_side.key


@pytest.fixture(scope="module")
def worker(servers: Servers, queue: str) -> Iterator[Any]:
    compatblockingapp.configure(
        broker_url=servers.broker_url, lock_url=servers.lock.url, queue=queue
    )
    yield from compat_side.start_worker(servers, queue, app="tests.celery.compatblockingapp")
    forget_locker(compatblockingapp.app)


def test_a_duplicate_waits_for_the_running_call_then_is_published(
    worker: Any, impl: str, key: str
) -> None:
    task = compatblockingapp.on_key[impl]
    sent: list[Any] = []  # what the duplicate's delay() returned, once it returns
    first = task.delay(key)
    running(key)
    with published(task) as ids:
        sender = threading.Thread(target=lambda: sent.append(task.delay(key)))
        sender.start()
        time.sleep(0.5)  # not a timing assertion: the gate stays shut, the sender waits
        assert ids == [] and sent == []
        compatapp.open_gate(key, 2)
        sender.join(timeout=compatblockingapp.BLOCKING_TIMEOUT + 10)
    assert len(sent) == 1 and sent[0].id != first.id
    assert ids == [sent[0].id]
    wait_until(lambda: len(compatapp.runs(key)) == 2, timeout=30)
    assert compatapp.runs(key) == [first.id, sent[0].id]
