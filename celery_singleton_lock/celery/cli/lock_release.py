"""Releasing a lock by hand: refused while its holder's worker answers a ping, unless
forced; and clearing a queued marker."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import click

from celery_singleton_lock.celery.cli.app_target import ReleaseRefused, Target, asking
from celery_singleton_lock.celery.cli.lock_listing import describe_holder, is_worker_node
from celery_singleton_lock.engine import LockHolder, LockKeys, slot_key, slot_of
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

    #: the key of the slot it looked at (the lock key for slot 1)
    key: str
    #: the holder read before releasing; None when the slot was free
    holder: Optional[LockHolder]
    released: bool
    #: when not released although held: who holds it now (None when it is free now)
    now: Optional[LockHolder] = None
    #: when released: calls parked behind it (policy ``queue``), made due for a hand-off
    parked: int = 0
    #: when no slot was named and slot 1 was free: the lock_limit's other slots still held
    held_slots: list[int] = field(default_factory=list)


#: ``release`` of a lock whose slot 1 is free looks for held slots among this many.
LOOKED_AT_SLOTS = 64


def release_lock(
    target: Target,
    name: str,
    *,
    is_alive: Optional[Callable[[str], bool]],
    slot: Optional[int] = None,
) -> Released:
    """Release ``slot`` of lock ``name`` (of its lock_limit; None: slot 1, the lock key) if its
    holder is gone: owner-checked, never a blind ``DEL``.

    Reads the slot's holder, asks ``is_alive(node)`` about the holder's worker node (None: do
    not ask, ``--force``), then releases with the engine's ``release_abandoned``: the key is
    deleted only if it still names that task, node and pid, and the release is published as
    any release is (waiters wake up). A slot that changed hands in between is left alone.
    With no slot named and slot 1 free, nothing is released: the slots still held are named
    (each is released on its own, its own holder's node asked).

    Raises:
        ReleaseRefused: the holder's node answered, or it is no worker node that can be asked.
        LockNotOwnedError: the key holds data this package did not write.
    """
    keys = LockKeys.build(target.inspector.prefix, name)  # a bad name is bad input, not
    # server trouble
    number = slot or 1
    key = slot_key(keys, number)
    inspector = target.inspector
    # the slots up to the one named, in one round trip (a quorum has slot 1 only)
    held = asking(target, lambda: inspector.holders(name, number))
    holder = next((seen for seen in held if slot_of(seen.key) == number), None)
    if holder is None:
        if slot is not None:
            return Released(key, None, False)
        others = asking(target, lambda: inspector.holders(name, LOOKED_AT_SLOTS))
        return Released(key, None, False, held_slots=[slot_of(seen.key) for seen in others])
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
    locker = target.backend
    task_id, host, pid = holder.task_id, holder.host, holder.pid
    released = asking(
        target,
        lambda: locker.release_abandoned(name, task_id=task_id, host=host, pid=pid, slot=number),
    )
    if released:
        # calls parked behind it: a worker's sweeper hands the freed slot on at its next tick
        queue = locker.queue
        parked = 0 if queue is None else asking(target, lambda: queue.hand_off_soon(name))
        return Released(key, holder, True, parked=parked)
    now = asking(target, lambda: inspector.holders(name, number))
    return Released(key, holder, False, next((h for h in now if slot_of(h.key) == number), None))


def release_command(invocation: str, name: str, slot: int) -> str:
    """The command line that releases ``slot`` of lock ``name`` (``invocation``: the command
    up to ``release``, e.g. ``celery -A proj locks``)."""
    return f"{invocation} release {shlex.quote(name)}" + (f" --slot {slot}" if slot > 1 else "")


def clear_queued_marker(target: Target, name: str) -> Optional[str]:
    """Delete the enqueue marker of lock ``name`` (``dedupe_on_enqueue``) if it still names the
    task id read first (compare-and-delete); that task id, or None when there was none."""
    LockKeys.build(target.inspector.prefix, name)  # a bad name is bad input, not server trouble
    markers = target.backend.markers
    if markers is None:  # a backend that keeps no markers has none to clear
        return None
    queued = asking(target, lambda: markers.queued(name))
    if queued is None or not asking(target, lambda: markers.clear_queued(name, queued)):
        return None
    return queued
