"""``lockapp`` with the lock metrics on: served on ``$CSL_METRICS_PORT``, pool processes
counting into ``$CSL_METRICS_DIR`` (the real-worker tests of tests/celery/test_metrics.py)."""

from __future__ import annotations

import os

from tests.celery.lockapp import app

app.conf.update(
    singleton_lock_metrics=True,
    singleton_lock_metrics_port=int(os.environ["CSL_METRICS_PORT"]),
    singleton_lock_metrics_dir=os.environ["CSL_METRICS_DIR"],
)

__all__ = ["app"]
