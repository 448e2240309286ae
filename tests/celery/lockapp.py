"""The Celery app the integration tests run, in-process or as real `celery worker` processes.

The app and its configuration are in :mod:`tests.celery.tasks.core`; the tasks in the modules
of :mod:`tests.celery.tasks`, one a job. This module registers them all on the app: it is what
the in-process worker serves (tests/celery/conftest.py) and what ``celery -A
tests.celery.lockapp`` loads (tests/celery/workers.py), so every task a test sends is known to
every worker.
"""

from __future__ import annotations

from tests.celery.tasks import (  # noqa: F401  (registers their tasks on the app)
    adapter,
    canvas,
    chaos,
    compat,
    dedupe,
    exits,
    expiry,
    gil,
    groups,
    join,
    limits,
    models,
    pausing,
    policies,
    queueing,
    restart,
    runtime,
    scope,
)
from tests.celery.tasks.core import app, configure

__all__ = ["app", "configure"]
