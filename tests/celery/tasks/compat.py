"""The drop-in replacements' tasks (:mod:`celery_singleton_lock.compat`: ``QueueOnce`` and
``Singleton``), each gated (tests/celery/test_compat.py)."""

from __future__ import annotations

from typing import Any

from celery_singleton_lock import LockedTask
from celery_singleton_lock.compat import QueueOnce, Singleton
from tests.celery.tasks.core import app, gated_body


def compat_task(name: str, base: type, **options: Any) -> Any:
    """A gated task ``name(key, other=0)`` (see :func:`~tests.celery.tasks.core.gated_body`)
    on ``base``."""

    def run(self: LockedTask, key: str, other: int = 0) -> str:
        return gated_body(key, self.request.id)

    run.__name__ = run.__qualname__ = name
    return app.task(bind=True, base=base, name=f"{__name__}.{name}", **options)(run)


once_on_key = compat_task("once_on_key", QueueOnce, once={"keys": ["key"]})
once_graceful = compat_task("once_graceful", QueueOnce, once={"keys": ["key"], "graceful": True})
once_all_args = compat_task("once_all_args", QueueOnce)
once_per_task = compat_task("once_per_task", QueueOnce, once={"keys": []})
once_timeout = compat_task("once_timeout", QueueOnce, once={"keys": ["key"], "timeout": 60})
once_unlock_before_run = compat_task(
    "once_unlock_before_run",
    QueueOnce,
    once={"keys": ["key"], "unlock_before_run": True},
    lock_retry_backoff=0.05,
    lock_retry_backoff_max=0.2,
)
singleton_on_key = compat_task("singleton_on_key", Singleton, unique_on=["key"])
singleton_all_args = compat_task("singleton_all_args", Singleton)
singleton_raises = compat_task(
    "singleton_raises", Singleton, unique_on="key", raise_on_duplicate=True
)
singleton_expiry = compat_task("singleton_expiry", Singleton, unique_on="key", lock_expiry=60)
