"""``on_duplicate="queue"``: what is refused at registration, naming the task and the option."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_singleton_lock import LockConfigurationError
from tests.celery.registration import register


def test_a_queue_task_registers(registration_app: Celery) -> None:
    app = registration_app
    assert register(app, on_duplicate="queue").lock_options.on_duplicate == "queue"


def test_queue_with_dedupe_on_enqueue_is_refused(registration_app: Celery) -> None:
    app = registration_app
    with pytest.raises(LockConfigurationError, match=r"billing\.job.*queue.*dedupe_on_enqueue"):
        register(app, on_duplicate="queue", dedupe_on_enqueue=True)


def test_queue_without_finish_records_is_refused(registration_app: Celery) -> None:
    app = registration_app
    with pytest.raises(LockConfigurationError, match=r"billing\.job.*queue.*lock_finished_ttl"):
        register(app, on_duplicate="queue", lock_finished_ttl=None)


def test_a_handoff_timeout_that_is_not_a_number_of_seconds_is_refused(
    registration_app: Celery,
) -> None:
    app = registration_app
    app.conf.singleton_lock_handoff_timeout = "soon"
    with pytest.raises(LockConfigurationError, match="singleton_lock_handoff_timeout"):
        register(app, on_duplicate="queue")
