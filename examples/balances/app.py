"""Account balances updated by concurrent tasks: a per-account lock with fencing tokens.

``apply_delta`` does what a lot of application code does: read the balance, compute, write it
back. Two such updates of one account running at once both read the same balance, and the
second write silently drops the first one's change (a *lost update*). ``LockedTask`` with
``lock_on=("account_id",)`` lets one update per account run at a time (the others park
behind it and run one after the other, in order: ``on_duplicate="queue"``), and
``lock_fencing=True`` hands each holder a fence the store uses to refuse
writes from a holder whose lock expired and was taken over.

``apply_delta_unlocked`` is the same code on a plain Celery ``Task``, for comparison.

Settings come from the environment: see ``examples.common.Settings.from_env``, plus
``BALANCES_DATABASE_URL`` (``sqlite:///path`` or ``postgresql://...``) and ``BALANCES_WORK_MS``
(the pause between the read and the write).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

from celery import Celery, states
from celery.signals import task_postrun

from celery_singleton_lock import LockedTask, lock_duplicate
from examples.balances.store import StaleFenceError, store_for
from examples.common import Settings, announce_readiness, configure_app, data_client

log = logging.getLogger("examples.balances")

settings = Settings.from_env()
DATABASE_URL = os.environ.get("BALANCES_DATABASE_URL", "sqlite:////tmp/csl-balances/ledger.db")
WORK_SECONDS = float(os.environ.get("BALANCES_WORK_MS", "5")) / 1000.0
LOCKED = "examples.balances.apply_delta"
UNLOCKED = "examples.balances.apply_delta_unlocked"
LEDGERS = {LOCKED: "locked", UNLOCKED: "plain"}

app = Celery("balances")
configure_app(app, settings)
announce_readiness(app, settings)


def key(*parts: str) -> str:
    return ":".join((settings.namespace, *parts))


# --8<-- [start:task]  (the docs' balances tutorial shows from here to its end marker)
@app.task(
    bind=True,
    name=LOCKED,
    base=LockedTask,
    lock_on=("account_id",),  # one lock per account: other accounts run in parallel
    on_duplicate="queue",  # a busy account: park the update; it runs right after, in order
    lock_fencing=True,  # self.request.lock.fence: strictly increasing per account
    autoretry_for=(StaleFenceError,),  # a refused write is retried (with a new lock and fence)
    max_retries=5,
    default_retry_delay=0.1,
)
def apply_delta(self: Any, account_id: int, cents: int, reason: Optional[str] = None) -> str:
    lock = self.request.lock
    fence = lock.fence if lock is not None else None
    try:
        return store_for(DATABASE_URL, "locked").apply(
            self.request.id, account_id, cents, fence, WORK_SECONDS
        )
    except StaleFenceError as exc:
        log.warning("task %s[%s]: %s", self.name, self.request.id, exc)
        data_client(settings.data).incr(key("rejected"))
        raise


# --8<-- [end:task]


@app.task(bind=True, name=UNLOCKED)
def apply_delta_unlocked(
    self: Any, account_id: int, cents: int, reason: Optional[str] = None
) -> str:
    return store_for(DATABASE_URL, "plain").apply(
        self.request.id, account_id, cents, None, WORK_SECONDS
    )


def count_duplicates(sender: Any = None, action: str = "?", **_: Any) -> None:
    """``lock_duplicate`` receiver: how often an update found its account busy."""
    if getattr(sender, "name", None) == LOCKED:
        data_client(settings.data).incr(key("duplicates", action))


lock_duplicate.connect(count_duplicates, weak=False)


def count_finished(sender: Any = None, state: Optional[str] = None, **_: Any) -> None:
    """``task_postrun`` receiver: counts updates that are done (not retrying), per ledger."""
    ledger = LEDGERS.get(getattr(sender, "name", None) or "")
    if ledger and state in states.READY_STATES:
        client = data_client(settings.data)
        client.incr(key("finished", ledger))
        if state != states.SUCCESS:
            client.incr(key("failed", ledger))


task_postrun.connect(count_finished, weak=False)
