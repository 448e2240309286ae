"""The Celery app whose locks the admin shows, from the Django settings, and its lock server.

``CELERY_SINGLETON_LOCK_APP``: the app, as ``"proj.celery:app"`` (what ``celery -A`` takes)
or the app object; unset, Celery's current app (the one a Django project's
``proj/__init__.py`` imports). ``CELERY_SINGLETON_LOCK_PING_TIMEOUT``: seconds a holder's
worker node has to answer a ping (1 by default). The lock server and prefix are the app's own
(``singleton_lock_url``, else its broker; ``singleton_lock_prefix``), as a worker's.
"""

from __future__ import annotations

from typing import Any

from celery import current_app
from celery.utils.imports import symbol_by_name
from django.conf import settings

from celery_singleton_lock.celery.cli.app_target import Target, open_target
from celery_singleton_lock.errors import LockConfigurationError

APP_SETTING = "CELERY_SINGLETON_LOCK_APP"
PING_SETTING = "CELERY_SINGLETON_LOCK_PING_TIMEOUT"


def lock_app() -> Any:
    """The Celery app named by ``CELERY_SINGLETON_LOCK_APP``, else the current app.

    Raises:
        LockConfigurationError: the setting names nothing that can be imported.
    """
    named = getattr(settings, APP_SETTING, None)
    if named is None:
        return current_app._get_current_object()
    if not isinstance(named, str):
        return named
    try:
        return symbol_by_name(named)
    except Exception as exc:  # noqa: BLE001 - the user's module may raise anything on import
        raise LockConfigurationError(
            f"{APP_SETTING} = {named!r} cannot be imported: {type(exc).__name__}: {exc}"
        ) from None


def ping_timeout() -> float:
    """Seconds a holder's worker node has to answer a ping."""
    return float(getattr(settings, PING_SETTING, 1.0))


def open_lock_server(app: Any) -> Target:
    """The lock server and prefix of ``app``; close it after use.

    Raises:
        LockConfigurationError: a bad URL, prefix or setting of the app, said in one line.
    """
    return open_target(app=app, app_label=f"the app of {APP_SETTING}")
