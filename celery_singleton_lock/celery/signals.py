"""Celery signals sent by locked tasks, for metrics and alerts.

Every signal is sent with ``sender`` = the task and these keyword arguments:

``lock_acquired``: ``task_id``, ``key``, ``fence``
    The lock was taken before the body runs (not sent for reentrant runs).
``lock_duplicate``: ``task_id``, ``key``, ``holder`` (dict), ``action``, ``reason``
    The lock was held; ``action`` is what this execution does about it:
    ``"skip"``, ``"retry"``, ``"wait"`` (about to block), ``"join"``, ``"queue"`` or
    ``"fail"``; ``reason`` is why it could not run: ``"held"`` (another execution holds the
    lock), ``"limit"`` (every one of the key's ``lock_limit`` slots is held), ``"cooldown"``
    (the key is in its ``lock_cooldown``), ``"rate"`` (its ``lock_rate`` allows no start) or
    ``"paused"`` (its task or group is paused: ``celery locks pause``, ``pause_for``).
``lock_lost``: ``task_id``, ``key``
    Renewal was refused (or Redis unreachable past the TTL) while the body ran. Sent from the
    renewer thread.
``lock_backend_error``: ``task_id``, ``key``, ``error`` (the ``LockBackendUnavailable``)
    The lock server could not be asked in ``before_start``; the task's
    ``lock_on_backend_error`` decides what follows.
``lock_released``: ``task_id``, ``key``, ``owned``
    The lock was released after the body; ``owned`` is False if it had already expired or
    been taken over. Also sent, with ``reclaimed=True``, when a worker's main process frees
    the lock of a child that died holding it.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = [
    "lock_acquired",
    "lock_backend_error",
    "lock_duplicate",
    "lock_lost",
    "lock_released",
]

# The two every task sends (when anything is connected) cache their receivers per sender (a
# task): a task none of them is for then costs a look-up, not a pass over every receiver under
# the signal's lock (measured with ``python -m bench fastpath``: its metrics-on contender
# connects receivers for its own task only). Their senders are always tasks (weakly
# referenced, as the cache needs).
lock_acquired = Signal(name="lock_acquired", use_caching=True)
lock_backend_error = Signal(name="lock_backend_error")
lock_duplicate = Signal(name="lock_duplicate")
lock_lost = Signal(name="lock_lost")
lock_released = Signal(name="lock_released", use_caching=True)
