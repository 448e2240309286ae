import os
import sqlite3
import time

from celery import Celery

from celery_singleton_lock import LockedTask

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")

app = Celery("quickstart", broker=REDIS_URL, backend=REDIS_URL)  # a skip is seen via results
# app.conf.singleton_lock_url = "redis://localhost:6379/1"  # optional: defaults to the broker

DB = os.environ.get("QUICKSTART_DB", "quickstart.sqlite3")


@app.task(base=LockedTask, lock_ttl=15, on_duplicate="skip")
def rebuild_report(day):
    time.sleep(2)  # a long job: a second call for the same day meanwhile is skipped
    return f"report for {day}"


# a second update of the same account parks behind the running one and runs right after it
@app.task(
    bind=True, base=LockedTask, lock_on=("account_id",), on_duplicate="queue", lock_fencing=True
)
def apply_delta(self, account_id, cents, reason=None):
    fence = self.request.lock.fence  # strictly increasing per account
    with sqlite3.connect(DB) as db:
        db.execute(
            "CREATE TABLE IF NOT EXISTS balances "
            "(account_id TEXT PRIMARY KEY, cents INTEGER, fence INTEGER)"
        )
        db.execute("INSERT OR IGNORE INTO balances VALUES (?, 0, 0)", (account_id,))
        self.request.lock.check()  # raises LockLostError if the lock was lost
        # the store refuses a write whose fence is not newer than the last one applied
        db.execute(
            "UPDATE balances SET cents = cents + ?, fence = ? WHERE account_id = ? AND fence < ?",
            (cents, fence, account_id, fence),
        )
