"""What a worker checks as it starts.

Configuration (:class:`ConfigurationCheck`): misspelt ``singleton_lock_*`` settings, a lock
  URL that is not Redis, and every locked task's options resolved against the settings as they
  are now (they may have changed since the task was registered). A worker with a bad
  configuration does not start: it logs one CRITICAL line naming the setting or task and exits
  with status 78 (``EX_CONFIG``) before its pool starts and before it says "ready".

Why a bootstep and not a ``worker_init`` receiver: Celery's signal dispatch catches and logs
whatever a receiver raises, and at ``worker_init`` logging is not set up yet, so the error
vanished and the worker started anyway. Bootsteps are built after logging is set up and before
anything starts, and an exception raised there is not caught: it ends the worker command.
"""

from __future__ import annotations

import difflib
import logging
import os
from typing import Any

from celery import bootsteps
from celery.exceptions import WorkerTerminate

from ..errors import LockConfigurationError
from .connection import choose_url, redact
from .options import KNOWN_SETTINGS, lock_prefix, unknown_settings
from .task import LockedTask

log = logging.getLogger("celery_singleton_lock.worker")

#: Exit status of a worker refused for its configuration (sysexits.h ``EX_CONFIG``).
EX_CONFIG = getattr(os, "EX_CONFIG", 78)


def locked_tasks(app: Any) -> list[LockedTask]:
    """The app's registered tasks that take a singleton lock."""
    return [task for task in app.tasks.values() if isinstance(task, LockedTask) and task.name]


def check_configuration(app: Any) -> None:
    """Validate the app's lock settings and every locked task's options.

    Raises:
        LockConfigurationError: naming the setting or task and what to do.
    """
    typos = unknown_settings(app.conf)
    if typos:
        raise LockConfigurationError(
            "unknown setting(s) "
            + ", ".join(_with_suggestion(typo) for typo in typos)
            + "; the settings are listed in celery_singleton_lock.celery.options"
        )
    choose_url(app.conf)  # raises on a lock URL that is not Redis
    for task in locked_tasks(app):
        type(task).resolve_lock_options(app)


def _with_suggestion(typo: str) -> str:
    close = difflib.get_close_matches(typo, sorted(KNOWN_SETTINGS), n=1)
    return f"{typo} (did you mean {close[0]}?)" if close else typo


class ConfigurationCheck(bootsteps.Step):  # type: ignore[misc]
    """Worker bootstep that refuses to start a worker whose lock configuration is invalid."""

    label = "singleton lock configuration"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        try:
            check_configuration(parent.app)
        except LockConfigurationError as exc:
            log.critical("celery-singleton-lock: worker not started: %s", exc)
            # SystemExit: not caught by Celery on the way out of the worker's constructor
            raise WorkerTerminate(EX_CONFIG) from exc


def install_configuration_check(app: Any) -> None:
    """Add :class:`ConfigurationCheck` to the app's worker blueprint.

    Called from ``worker_init``, which Celery sends just before it builds the blueprint from
    ``app.steps["worker"]``.
    """
    app.steps["worker"].add(ConfigurationCheck)


def report_lock_server(app: Any) -> None:
    """Log which server holds the locks (``worker_ready``)."""
    url, source = choose_url(app.conf)
    log.info(
        "singleton locks on %s (from %s), prefix %r, %d locked task(s)",
        redact(url),
        source,
        lock_prefix(app.conf),
        len(locked_tasks(app)),
    )
