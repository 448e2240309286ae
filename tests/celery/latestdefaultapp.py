"""lockapp's latest-wins tasks (:mod:`tests.celery.latestapp`) on workers whose hand-off
sweeper keeps the default interval (1 s), not latestapp's 0.1 s: a debounce's end is met by
the sweeper sleeping until it, not by looking often (tests/celery/test_latest_wins_workers.py)."""

from __future__ import annotations

from celery_singleton_lock.celery.config.options import APP_SETTINGS
from tests.celery.latestapp import app

app.conf.singleton_lock_handoff_sweep_interval = APP_SETTINGS[
    "singleton_lock_handoff_sweep_interval"
].default
