"""A prefork child never uses its parent's lock client (lock_server._ChildMakesItsOwnLockers)."""

from __future__ import annotations

import os
import signal
from typing import Any

from celery_singleton_lock.celery.config.lockers import locker_for
from celery_singleton_lock.engine import Lease


def test_a_child_forked_while_a_thread_was_inside_the_lock_client_takes_locks(
    celery_app: Any, unique_key: str
) -> None:
    parent_locker = locker_for(celery_app)
    parent_locker.client.ping()
    # the state a fork finds when another thread of the parent (the main process's renewal
    # or hand-off thread) is inside a command: the pool's lock is held
    with parent_locker.client.connection_pool._lock:
        pid = os.fork()
        if pid == 0:  # the child: a hang is cut short by the alarm (exit by SIGALRM)
            signal.alarm(10)
            try:
                child_locker = locker_for(celery_app)
                lease = child_locker.try_acquire(unique_key, 5, renew=False)
                os._exit(0 if child_locker is not parent_locker and isinstance(lease, Lease) else 1)
            except BaseException:  # noqa: BLE001 - the child must always exit
                os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
