"""App settings read as Celery reads them, and the app-wide ones of the lock: what the locker,
the servers and the policy ``queue``'s hand-offs need without a task's options."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from celery_singleton_lock.celery.config.options import APP_SETTINGS, required_seconds_of
from celery_singleton_lock.errors import LockConfigurationError


def celery_setting(conf: Mapping[str, Any], name: str) -> Any:
    """A Celery setting as Celery reads it: ``broker_url``, ``broker_write_url`` and
    ``result_backend`` also come from ``$CELERY_BROKER_URL``, ``$CELERY_BROKER_WRITE_URL`` and
    ``$CELERY_RESULT_BACKEND`` (what ``celery -b`` and ``--result-backend`` set), which their
    properties read and ``conf.get()`` does not."""
    return getattr(conf, name, None) or conf.get(name)


def lock_prefix(conf: Mapping[str, Any]) -> Any:
    """The configured key prefix (validated by the caller); the default when unset."""
    prefix = conf.get("singleton_lock_prefix")
    return APP_SETTINGS["singleton_lock_prefix"].default if prefix is None else prefix


def metrics_port(conf: Mapping[str, Any]) -> Optional[int]:
    """The port the worker serves ``/metrics`` on (``singleton_lock_metrics_port``), None for
    none.

    Raises:
        LockConfigurationError: naming the setting.
    """
    port = conf.get("singleton_lock_metrics_port")
    if port is not None and (
        isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535
    ):
        raise LockConfigurationError(
            f"singleton_lock_metrics_port must be None or a TCP port (0-65535), got {port!r}"
        )
    return port


#: Policies ``queue`` and ``replace``: seconds a slot handed to a parked call stays reserved
#: until its message is published. The process that publishes it then makes the reservation
#: live ``handoff_timeout`` (the message is on its way); one that dies first (``kill -9``
#: between its release and the publish) stalls the lock this long, not the whole timeout,
#: before a sweeper reserves it again and sends the message.
SEND_WINDOW = 3.0


def handoff_settings(conf: Mapping[str, Any]) -> tuple[float, float]:
    """The sweep interval and the reservation TTL of policy ``queue``, validated.

    Raises:
        LockConfigurationError: naming the setting.
    """
    sweep, timeout = (
        required_seconds_of("", setting, _or_default(conf, setting))
        for setting in ("singleton_lock_handoff_sweep_interval", "singleton_lock_handoff_timeout")
    )
    return sweep, timeout


def _or_default(conf: Mapping[str, Any], setting: str) -> Any:
    """``setting``'s value in ``conf``; its declared default when unset or None."""
    value = conf.get(setting)
    return APP_SETTINGS[setting].default if value is None else value
