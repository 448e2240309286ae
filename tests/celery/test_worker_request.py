"""What the worker's main process writes into a locked task's request dict for the pool child:
the time it received the message, from which ``celery_lock_acquire_seconds`` is measured."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

from celery.contrib.testing.mocks import TaskMessage

from celery_singleton_lock.celery.celery_api import RECEIVED_FIELD
from celery_singleton_lock.celery.task.worker_request import LockedRequest
from tests.celery import lockapp
from tests.celery.tasks import policies


def build(**headers: object) -> LockedRequest:
    message = TaskMessage(policies.hold_skip.name, args=("k",), **headers)
    return LockedRequest(message, app=lockapp.app, task=policies.hold_skip)


def test_a_request_carries_the_wall_clock_time_it_was_built_as_its_receipt() -> None:
    before = time.time()
    received = build().request_dict[RECEIVED_FIELD]
    assert before <= received <= time.time()


def test_a_request_whose_eta_is_later_is_received_at_its_eta() -> None:
    eta = datetime.now(timezone.utc) + timedelta(hours=1)
    assert build(eta=eta.isoformat()).request_dict[RECEIVED_FIELD] == eta.timestamp()


def test_a_request_whose_eta_has_passed_is_received_when_it_was_built() -> None:
    eta = datetime.now(timezone.utc) - timedelta(hours=1)
    before = time.time()
    assert build(eta=eta.isoformat()).request_dict[RECEIVED_FIELD] >= before
