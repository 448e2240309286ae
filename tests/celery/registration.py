"""Registering a locked task on an app that is never started: what registration accepts and
refuses (tests/celery/test_*_registration.py; their fixture ``registration_app`` is in
conftest.py). The app's lock server is never contacted."""

from __future__ import annotations

from typing import Any

from celery import Celery

from celery_singleton_lock import LockedTask


def app_with(**conf: Any) -> Celery:
    """A finalized app whose locks would live on a server nobody contacts."""
    app = Celery("registration", set_as_current=False, broker="memory://")
    app.conf.update(singleton_lock_url="redis://127.0.0.1:1/0", **conf)  # never contacted
    app.finalize()
    return app


def register(app: Celery, **options: Any) -> Any:
    """``billing.job(account_id)`` registered on ``app`` as a locked task with ``options``."""

    def job(account_id: int) -> None:
        return None

    # shared=False: a shared task would be re-registered on every app finalized later
    return app.task(name="billing.job", base=LockedTask, shared=False, **options)(job)
