"""What the PostgreSQL backend supports (:data:`POSTGRES`), apart from the backend so that the
Celery layer can refuse an option from the settings alone, without psycopg installed."""

from __future__ import annotations

from celery_singleton_lock.engine.capabilities import Capabilities

#: What row leases in PostgreSQL support (see :mod:`.locker`). Each refusal says why.
#: Admission is: slots (lock_limit), rate, cooldown, queued markers (dedupe_on_enqueue); the
#: queue parts (queue, replace, restart, debounce) are written for the mutex: a queue behind
#: several slots, a rate or a cooldown is refused (``parking_slots``).
POSTGRES = Capabilities(
    fencing=True,
    replica_acks=False,
    parking=True,  # queue (one holder), replace, restart, debounce: parking.py, latest.py
    enqueue_markers=True,  # admission: markers.py
    cluster=False,
    kind="PostgreSQL row leases",
    instead="use a Redis lock server (singleton_lock_url = 'redis://...')",
    slots=True,  # admission: slots.py
    cooldown=True,  # admission: locker.py release_cooling
    rate=True,  # admission: slots.py
    parking_slots=False,
    reasons=(
        (
            "replica_acks",
            "waiting for replicas is Redis' WAIT; on PostgreSQL it is the server's own "
            "synchronous_commit and synchronous_standby_names",
        ),
        (
            "parking_slots",
            "its queue hands on a lock with one holder: parked calls behind several slots, "
            "a rate or a cooldown are not written for PostgreSQL yet",
        ),
    ),
)
