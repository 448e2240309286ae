"""What the PostgreSQL backend supports (:data:`POSTGRES`), apart from the backend so that the
Celery layer can refuse an option from the settings alone, without psycopg installed."""

from __future__ import annotations

from celery_singleton_lock.engine.capabilities import Capabilities

#: What row leases in PostgreSQL support (see :mod:`.locker`). Each refusal says why: the
#: parts not written for this backend yet (issue 34's later steps). A queue is written for the
#: mutex: with ``lock_limit`` > 1, a rate or a cooldown it is refused by those features.
POSTGRES = Capabilities(
    fencing=True,
    replica_acks=False,
    parking=True,  # queue (one holder), replace, restart, debounce: parking.py, latest.py
    enqueue_markers=False,
    cluster=False,
    kind="PostgreSQL row leases",
    instead="use a Redis lock server (singleton_lock_url = 'redis://...')",
    slots=False,
    cooldown=False,
    rate=False,
    reasons=(
        (
            "replica_acks",
            "waiting for replicas is Redis' WAIT; on PostgreSQL it is the server's own "
            "synchronous_commit and synchronous_standby_names",
        ),
        ("enqueue_markers", "queued markers are not written for PostgreSQL yet"),
        ("slots", "a lock with several holders is not written for PostgreSQL yet"),
        ("cooldown", "a release that leaves the lock taken is not written for PostgreSQL yet"),
        ("rate", "counting starts in a window is not written for PostgreSQL yet"),
    ),
)
