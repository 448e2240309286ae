"""Policy ``restart``: the newest call stops the running call of its lock and runs in its place.

The newest call waits behind the lock exactly as ``replace``'s does (:mod:`.latest`): parked in
Redis, holding no worker slot, displacing an older waiting call (which ends superseded). Then,
in a second round trip, it asks the running holder to stop: the engine flags the holder's task
id beside the lock (``cancel_holder``). The holder learns it two ways:

- **its body** looks at ``self.request.lock.cancelled``: its first look reads the flag and has
  its process listen on the lock's cancel channel, where the stop is pushed (no round trip per
  look; a read every :data:`~..task.execution.CANCEL_POLL` seconds is the fallback), and may
  return early, or call
  ``self.request.lock.raise_if_cancelled()``, which ends it REVOKED with the reason
  ``"superseded"`` (:func:`end_cancelled`), as ``replace``'s displaced calls end;
- **its worker's main process** (prefork only) reads the flags of the locks its children hold
  on each supervisor tick, and terminates a child still running ``lock_cancel_grace`` seconds
  after its call was asked to stop (:mod:`..worker.cancel_grace`).

Either way the lock is released only when the old body is over (its release, or the main
process freeing a dead child's lock), and the release hands it to the waiting call: never two
bodies of one key at once. Threads, gevent and solo pools have no child to terminate: there it
is cooperative only.
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

from celery.exceptions import Ignore

from celery_singleton_lock.celery import celery_api
from celery_singleton_lock.celery.duplicates import latest
from celery_singleton_lock.celery.duplicates.actions import Duplicate
from celery_singleton_lock.engine import Parked, required
from celery_singleton_lock.errors import LockError

log = logging.getLogger("celery_singleton_lock.duplicate")


def stop_holder_and_wait(duplicate: Duplicate, parked: Parked) -> NoReturn:
    """This call waits behind the lock as the newest (parked by the acquire itself): ask the
    running holder to stop, then end now, holding no worker slot, as ``replace``'s waiting
    call does. A holder that cannot be asked (the server went away meanwhile) runs to its end
    and hands the lock on then."""
    task, request = duplicate.task, duplicate.request
    if parked.holder is not None:
        try:
            locker = task.lock_locker
            cancels = required(locker.cancels, locker, "on_duplicate='restart'", "parking")
            stopped = cancels.cancel_holder(duplicate.name, request.id)
        except LockError as exc:
            log.warning(
                "task %s: could not ask the running call of lock %s to stop (%s); waiting for "
                "its end",
                duplicate.label,
                parked.key,
                exc,
            )
        else:
            if stopped is not None:
                log.info(
                    "task %s: asked the running call %s of lock %s to stop",
                    duplicate.label,
                    stopped,
                    parked.key,
                )
    latest.wait_newest(duplicate, parked)


def end_cancelled(task: Any, request: Any, key: str) -> NoReturn:
    """End the running call ``request`` of ``task``, which a newer call asked to stop: REVOKED
    ("superseded"), its revoke broadcast; its lock is released as the body's end releases it
    (and handed to the newer call)."""
    log.info("task %s[%s]: stopped for a newer call of lock %s", task.name, request.id, key)
    latest.mark_superseded(task, request, "a newer call", key, request.hostname or "")
    celery_api.logged_already(request.id)
    raise Ignore(f"stopped for a newer call of lock {key} (superseded)")
