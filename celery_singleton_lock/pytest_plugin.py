"""The pytest plugin of celery-singleton-lock (entry point ``pytest11``: ``singleton_lock``).

Installed with the package, active in every pytest run (``-p no:singleton_lock`` turns it
off). It adds one fixture:

``singleton_lock_url`` (session)
    the URL of a throwaway ``redis-server`` on a free loopback port, started on first use and
    killed at the end of the session: the system binary, else the one the ``embedded`` extra
    ships (see :class:`celery_singleton_lock.testing.RedisServer`). Point ``singleton_lock_url``
    (and, if you like, the broker and result backend) of your test app at it.

Use it with Celery's own pytest fixtures (``celery_config``, ``celery_app``, ``celery_worker``)
and :func:`celery_singleton_lock.testing.hold_lock`, which holds the lock a call would take.
This module imports neither Celery nor pytest-celery.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from celery_singleton_lock.testing import RedisServer

__all__ = ["singleton_lock_url"]


@pytest.fixture(scope="session")
def singleton_lock_url() -> Iterator[str]:
    """URL (``redis://127.0.0.1:<port>/0``) of a redis-server of this test session's own."""
    with RedisServer.running() as server:
        yield server.url
