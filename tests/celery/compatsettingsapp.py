"""The app of the side-by-side tests of celery-singleton's app-wide settings
(tests/celery/test_compat_settings.py): ``singleton_lock_expiry`` and ``singleton_key_prefix``
apply to every ``Singleton`` task of an app, so they get apps of their own. ``app`` is the one
the worker serves; ``other`` has the same tasks under another ``singleton_key_prefix`` (two
deployments sharing one lock server), sets ``singleton_raise_on_duplicate`` and only sends, to
the same queue.

Bodies and helpers are tests/celery/compatapp.py's (configured alongside, from the same
``CSL_*`` environment variables in a worker).
"""

from __future__ import annotations

from celery import Celery
from celery_singleton import Singleton as OriginalSingleton

from celery_singleton_lock.compat import Singleton
from tests.celery import compatapp

app = Celery("compatsettings")
other = Celery("compatsettings_other")

#: singleton_lock_expiry of both apps: seconds a queued call blocks duplicates
EXPIRY = 30
PREFIX = "compat-settings-"
OTHER_PREFIX = "compat-other-"


def configure(*, broker_url: str, lock_url: str, queue: str) -> None:
    common = compatapp.common_settings(broker_url=broker_url, lock_url=lock_url, queue=queue)
    for target, prefix in ((app, PREFIX), (other, OTHER_PREFIX)):
        target.conf.update(common, singleton_lock_expiry=EXPIRY, singleton_key_prefix=prefix)
    other.conf.singleton_raise_on_duplicate = True


_environment = compatapp.environment()
if _environment:
    configure(**_environment)

on_key = compatapp.pair(
    "on_key", OriginalSingleton, Singleton, on=app, module=__name__, unique_on="key"
)
other_on_key = compatapp.pair(
    "on_key", OriginalSingleton, Singleton, on=other, module=__name__, unique_on="key"
)
