"""Releasing a lock by hand: refused while its holder's worker answers a ping, unless
forced; and clearing a queued marker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import click

from celery_singleton_lock.celery.cli.app_target import ReleaseRefused, Target, asking
from celery_singleton_lock.celery.cli.lock_listing import describe_holder, is_worker_node
from celery_singleton_lock.engine import LockHolder, LockKeys
from celery_singleton_lock.errors import LockBackendUnavailable

#: Seconds ``release`` waits, by default, for the holder's worker node to answer a ping.
PING_TIMEOUT = 2.0


def ping_timeout_option(default: float, help: str) -> Callable[[Any], Any]:
    """The ``--ping-timeout`` option of the commands that ask worker nodes (a click decorator)."""
    return click.option(
        "--ping-timeout",
        type=click.FloatRange(min=0.1, max=60),
        default=default,
        show_default=True,
        help=help,
    )


def node_is_alive(app: Any, node: str, timeout: float) -> bool:
    """True if the worker node ``node`` answers a control ping within ``timeout`` seconds.

    Raises:
        LockBackendUnavailable: the broker could not be asked (bounded by kombu's retries).
    """
    try:
        replies = app.control.ping(destination=[node], timeout=timeout, limit=1)
    except Exception as exc:  # noqa: BLE001 - a broker transport may raise anything: a refused
        # connection, an unknown scheme, a missing transport module
        raise LockBackendUnavailable(
            f"cannot ask worker node {node!r} whether it is alive: {type(exc).__name__}: {exc}; "
            "use --force to release without asking"
        ) from None
    return any(node in reply for reply in replies or [])


@dataclass
class Released:
    """What ``release`` did."""

    #: the holder read before releasing; None when the lock was free
    holder: Optional[LockHolder]
    released: bool
    #: when not released although held: who holds it now (None when it is free now)
    now: Optional[LockHolder] = None
    #: when released: calls parked behind it (policy ``queue``), made due for a hand-off
    parked: int = 0


def release_lock(
    target: Target, name: str, *, is_alive: Optional[Callable[[str], bool]]
) -> Released:
    """Release lock ``name`` if its holder is gone: owner-checked, never a blind ``DEL``.

    Reads the holder, asks ``is_alive(node)`` about the holder's worker node (None: do not
    ask, ``--force``), then releases with the engine's ``release_abandoned``: the key is
    deleted only if it still names that task, node and pid, and the release is published as
    any release is (waiters wake up). A lock that changed hands in between is left alone.

    Raises:
        ReleaseRefused: the holder's node answered, or it is no worker node that can be asked.
        LockNotOwnedError: the key holds data this package did not write.
    """
    LockKeys.build(target.inspector.prefix, name)  # a bad name is bad input, not server trouble
    holder = asking(target, lambda: target.inspector.read(name))
    if holder is None:
        return Released(None, False)
    if holder.pid is None:
        raise ReleaseRefused(
            f"lock {holder.key}: its value names no pid, so no owner check can match it; "
            "it was not written by this package's release of a worker"
        )
    if is_alive is not None:
        if not is_worker_node(holder.host):
            raise ReleaseRefused(
                f"lock {holder.key} is held by {describe_holder(holder)}, which is not a Celery "
                "worker node (the lock was taken outside a worker): it cannot be asked whether "
                "it is alive; use --force to release anyway"
            )
        if is_alive(holder.host):
            raise ReleaseRefused(
                f"lock {holder.key} is held by {describe_holder(holder)} (alive: answered "
                "ping); use --force to release anyway"
            )
    inspector = target.inspector
    locker = target.locker()
    task_id, host, pid = holder.task_id, holder.host, holder.pid
    released = asking(
        target, lambda: locker.release_abandoned(name, task_id=task_id, host=host, pid=pid)
    )
    if released:
        # calls parked behind it: a worker's sweeper hands the lock on at its next tick
        parked = asking(target, lambda: locker.hand_off_soon(name))
        return Released(holder, True, parked=parked)
    return Released(holder, False, asking(target, lambda: inspector.read(name)))


def clear_queued_marker(target: Target, name: str) -> Optional[str]:
    """Delete the enqueue marker of lock ``name`` (``dedupe_on_enqueue``) if it still names the
    task id read first (compare-and-delete); that task id, or None when there was none."""
    LockKeys.build(target.inspector.prefix, name)  # a bad name is bad input, not server trouble
    locker = target.locker()
    queued = asking(target, lambda: locker.queued(name))
    if queued is None or not asking(target, lambda: locker.clear_queued(name, queued)):
        return None
    return queued
