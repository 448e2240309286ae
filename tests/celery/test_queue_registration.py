"""``on_duplicate="queue"``: what is refused at registration, naming the task and the option."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from celery import Celery

from celery_singleton_lock import LockConfigurationError, LockedTask


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("queue-cfg", set_as_current=False, broker="memory://")
    app.conf.update(singleton_lock_url="redis://127.0.0.1:1/0")  # never contacted
    app.finalize()
    yield app
    app.close()


def register(app: Celery, **options: Any) -> Any:
    def job(account_id: int) -> None:
        return None

    # shared=False: a shared task would be re-registered on every app finalized later
    return app.task(name="billing.job", base=LockedTask, shared=False, **options)(job)


def test_a_queue_task_registers(app: Celery) -> None:
    assert register(app, on_duplicate="queue").lock_options.on_duplicate == "queue"


def test_queue_with_dedupe_on_enqueue_is_refused(app: Celery) -> None:
    with pytest.raises(LockConfigurationError, match=r"billing\.job.*queue.*dedupe_on_enqueue"):
        register(app, on_duplicate="queue", dedupe_on_enqueue=True)


def test_queue_without_finish_records_is_refused(app: Celery) -> None:
    with pytest.raises(LockConfigurationError, match=r"billing\.job.*queue.*lock_finished_ttl"):
        register(app, on_duplicate="queue", lock_finished_ttl=None)


def test_a_handoff_timeout_that_is_not_a_number_of_seconds_is_refused(app: Celery) -> None:
    app.conf.singleton_lock_handoff_timeout = "soon"
    with pytest.raises(LockConfigurationError, match="singleton_lock_handoff_timeout"):
        register(app, on_duplicate="queue")
