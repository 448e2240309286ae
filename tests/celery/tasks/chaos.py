"""Tasks of the chaos suite (tests/chaos/test_faults.py). They write to a store on a Redis
server of its own, named by ``CSL_STORE_URL`` (see tests/chaos/fenced_store.py), and a
``lock_lost`` receiver records every lost lock of theirs there."""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import redis

from celery_singleton_lock import LockedTask, LockLostError, lock_lost
from tests.celery.tasks.core import app

#: the names of the two tasks below, compared as strings: reading a task's name from its
#: proxy would finalize the app, and the receiver may run before it is configured
CHAOS_TASKS = (f"{__name__}.chaos_balance", f"{__name__}.chaos_stall")

_chaos_client: Optional[redis.Redis] = None
_chaos_pid = 0


def chaos_client() -> redis.Redis:
    """This process's client of the chaos store server (``CSL_STORE_URL``)."""
    global _chaos_client, _chaos_pid
    if _chaos_client is None or _chaos_pid != os.getpid():
        _chaos_client = redis.Redis.from_url(
            os.environ["CSL_STORE_URL"], socket_timeout=5, socket_connect_timeout=2
        )
        _chaos_pid = os.getpid()
    return _chaos_client


def chaos_store(ns: str) -> Any:
    from tests.chaos.fenced_store import FencedStore

    return FencedStore(chaos_client(), ns)


def _stale_fence() -> type[Exception]:
    from tests.chaos.fenced_store import StaleFence

    return StaleFence


class ChaosStaleFence(Exception):
    """Raised by chaos_balance when the store refused its fence: Celery retries it."""


@app.task(
    bind=True,
    base=LockedTask,
    acks_late=True,
    lock_on=("account",),
    lock_fencing=True,
    lock_ttl=3,
    on_duplicate="retry",
    lock_retry_backoff=0.05,
    lock_retry_backoff_max=0.5,
    autoretry_for=(ChaosStaleFence,),
    max_retries=50,
    default_retry_delay=0.1,
)
def chaos_balance(
    self: LockedTask, account: str, cents: int, ns: str, work: float = 0.05, after: float = 0.0
) -> str:
    """One fenced read-modify-write of ``account`` in the chaos store: claim-read, ``work``
    seconds, write; then ``after`` seconds more under the lock (a window in which a kill finds
    the write applied and the message not yet acknowledged)."""
    fence = self.request.lock.fence
    st = chaos_store(ns)
    st.record_run(account, self.request.id, os.getpid(), fence, self.request.hostname or "?")
    try:
        outcome = str(st.apply(self.request.id, account, cents, fence, work))
    except _stale_fence() as exc:
        raise ChaosStaleFence(str(exc)) from None
    time.sleep(after)
    return outcome


@app.task(
    bind=True,
    base=LockedTask,
    lock_on=("account",),
    lock_fencing=True,
    lock_ttl=1,
    on_duplicate="retry",
    lock_retry_backoff=0.05,
    lock_retry_backoff_max=0.3,
)
def chaos_stall(
    self: LockedTask, account: str, cents: int, ns: str, go_key: Optional[str] = None
) -> dict[str, Any]:
    """Claim-read ``account``; with ``go_key``, wait (up to 60 s) for that key to exist before
    writing, so the test can stall this process in between. Records in ``<ns>:stall:<id>``
    what the write did and whether the handle said the lock was lost afterwards."""
    handle = self.request.lock
    fence = handle.fence
    st = chaos_store(ns)
    st.record_run(account, self.request.id, os.getpid(), fence, self.request.hostname or "?")
    read = st.claim(self.request.id, account, fence)
    if go_key is not None:
        deadline = time.monotonic() + 60
        while not st.client.exists(go_key) and time.monotonic() < deadline:
            time.sleep(0.05)
    write = "already" if read is None else st.write(self.request.id, account, cents, fence, read)
    # the renewer thread resumed with us: give it a bounded moment to report the loss
    deadline = time.monotonic() + 3
    while not handle.lost and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        handle.check()
        check_raised = ""
    except LockLostError as exc:
        check_raised = type(exc).__name__
    outcome = {"fence": fence, "write": write, "lost": handle.lost, "check_raised": check_raised}
    st.client.hset(
        st.key("stall", self.request.id), mapping={k: str(v) for k, v in outcome.items()}
    )
    return outcome


def _record_chaos_lock_lost(
    sender: Any = None, task_id: Optional[str] = None, key: Optional[str] = None, **_: Any
) -> None:
    if getattr(sender, "name", None) in CHAOS_TASKS and os.environ.get("CSL_STORE_URL"):
        from tests.chaos.fenced_store import LOCK_LOST_LIST

        chaos_client().rpush(LOCK_LOST_LIST, f"{task_id}|{key}|{time.time():.6f}")


lock_lost.connect(_record_chaos_lock_lost, weak=False)
