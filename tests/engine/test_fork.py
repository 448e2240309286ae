"""A forked child never renews or releases the leases it inherited, and renews its own."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any, ContextManager, Optional

import redis

from celery_singleton_lock.engine import Lease, RedisLocker, current_pid, process_renewer
from celery_singleton_lock.testing import RedisServer
from tests.engine.conftest import stored_token


def _run_in_child(body) -> int:  # type: ignore[no-untyped-def]
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            code = 0 if body() else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_the_kept_process_id_is_the_childs_own_in_a_forked_child() -> None:
    parent = current_pid()
    assert parent == os.getpid()
    assert _run_in_child(lambda: current_pid() == os.getpid() != parent) == 0


def test_child_does_not_release_an_inherited_lease(redis_server: RedisServer) -> None:
    client = redis_server.client()
    locker = RedisLocker(client, prefix="t")
    lease = locker.try_acquire("parent-job", ttl=30, renew=False)
    assert isinstance(lease, Lease)
    assert _run_in_child(lambda: lease.release() is False and lease.inherited) == 0
    assert stored_token(client, lease.key) == lease.token.encode()
    assert lease.release() is True


def test_child_does_not_renew_inherited_leases_but_renews_its_own(
    redis_server: RedisServer,
) -> None:
    client = redis_server.client()
    locker = RedisLocker(client, prefix="t")  # the process renewer, as in production
    parent_lease = locker.try_acquire("parent-job", ttl=30)
    assert isinstance(parent_lease, Lease)

    def child() -> bool:
        if process_renewer().leases():
            return False  # inherited leases must not be in the child's renewer
        own = locker.try_acquire("child-job", ttl=0.6)
        time.sleep(1.5)
        child_client = redis.Redis(host="127.0.0.1", port=redis_server.port)
        return bool(
            isinstance(own, Lease)
            and stored_token(child_client, own.key) == own.token.encode()
            and own.release()
        )

    assert _run_in_child(child) == 0
    assert stored_token(client, parent_lease.key) == parent_lease.token.encode()
    parent_lease.release()


def _child_forked_while_a_thread_holds(
    lock: Any, section: Optional[ContextManager[Any]] = None, seconds: float = 0.0
) -> int:
    """Exit code of a child forked while another thread, inside ``section``, holds ``lock``
    (until the child is done, or ``seconds``): 0 if the child takes ``lock``, SIGALRM's after
    3 s if its copy is held for ever."""
    held, done = threading.Event(), threading.Event()

    def hold_it() -> None:
        with section or contextlib.nullcontext(), lock:
            held.set()
            done.wait(seconds or 10)

    holder = threading.Thread(target=hold_it)
    holder.start()
    held.wait(5)
    try:
        pid = os.fork()
        if pid == 0:
            signal.alarm(3)
            with lock:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
    finally:
        done.set()
        holder.join(5)
    return os.waitstatus_to_exitcode(status)


def test_a_lock_held_by_another_thread_at_the_fork_is_free_in_the_child() -> None:
    from celery_singleton_lock.engine import lease as lease_module

    assert _child_forked_while_a_thread_holds(lease_module._state_lock) == 0


def test_a_fork_waits_for_a_no_fork_section_and_the_child_finds_its_locks_free() -> None:
    # A lock of a library that no fork handler resets (kombu's cached properties), taken by
    # another thread inside a section: the fork waits for the section, lock released.
    from celery_singleton_lock.engine import no_fork

    assert _child_forked_while_a_thread_holds(threading.RLock(), no_fork, seconds=0.3) == 0
