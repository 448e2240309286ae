"""``dedupe_on_enqueue`` with a lock server that cannot be reached: the call is published
anyway (the run-time lock still guards its body), even by a process that never reached the
server before (its locker is made on first use)."""

from __future__ import annotations

import logging
import socket

import pytest
from celery import Celery

from celery_singleton_lock import LockedTask


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_first_send_with_the_lock_server_down_is_published_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = Celery("outage", broker="memory://", set_as_current=False)
    app.conf.singleton_lock_url = f"redis://127.0.0.1:{closed_port()}/0"

    def job(account_id: int) -> None:
        return None

    task = app.task(name="billing.job", base=LockedTask, shared=False, dedupe_on_enqueue=True)(job)
    app.finalize()
    with caplog.at_level(logging.WARNING), app.connection_for_write() as connection:
        result = task.apply_async((1,), connection=connection)
    assert result.id
    assert "publishing it anyway" in caplog.text
