"""The app of the side-by-side tests of celery-once's ``blocking`` setting
(tests/celery/test_compat_blocking.py): ``ONCE["settings"]["blocking"]`` applies to every
``QueueOnce`` task of an app, so it gets an app of its own. With it, a duplicate waits up to
``blocking_timeout`` for the call before it to end, then is published.

Bodies and helpers are tests/celery/compatapp.py's (configured alongside, from the same
``CSL_*`` environment variables in a worker).
"""

from __future__ import annotations

from celery import Celery

from celery_singleton_lock.compat import QueueOnce
from tests.celery import compatapp

app = Celery("compatblocking")

#: ONCE's blocking_timeout: long enough for a gated body the test opens to end
BLOCKING_TIMEOUT = 20


def configure(*, broker_url: str, lock_url: str, queue: str) -> None:
    app.conf.update(
        compatapp.common_settings(broker_url=broker_url, lock_url=lock_url, queue=queue),
        ONCE={
            "backend": "celery_once.backends.Redis",
            "settings": {
                "url": lock_url,
                "default_timeout": 3600,
                "blocking": True,
                "blocking_timeout": BLOCKING_TIMEOUT,
            },
        },
    )


_environment = compatapp.environment()
if _environment:
    configure(**_environment)

on_key = compatapp.pair(
    "on_key",
    compatapp.OriginalQueueOnce,
    QueueOnce,
    on=app,
    module=__name__,
    once={"keys": ["key"]},
)
