"""Checks of "latest wins": policies ``replace`` and ``restart``, ``lock_debounce``/
``lock_debounce_max`` and ``lock_cancel_grace``, refused at registration when they contradict
the task's other options, naming the task."""

from __future__ import annotations

import logging
from typing import Any, Mapping, Optional

from celery_singleton_lock.celery.config.options import UNSET, required_seconds_of, seconds_of
from celery_singleton_lock.celery.duplicates.policies import DuplicatePolicy, Replace
from celery_singleton_lock.errors import LockConfigurationError

log = logging.getLogger("celery_singleton_lock.config")

#: Pools that run bodies in the worker's own process: no child to terminate, so a restart only
#: asks the running call to stop.
COOPERATIVE_POOLS = ("threads", "solo", "gevent", "eventlet")


def check_latest_wins(
    task: str, policy: DuplicatePolicy, values: Mapping[str, Any]
) -> tuple[Optional[float], Optional[float]]:
    """The task's ``lock_debounce`` and ``lock_debounce_max``, checked with its policy: a
    debounce is a way of replacing (``replace``, the policy whose acquire waits as the newest
    call); None, None for any other policy. The policy's own needs are its ``check``.

    Raises:
        LockConfigurationError: naming the task and the options that contradict each other.
    """
    debounce = seconds_of(f"task {task}", "lock_debounce", values.get("lock_debounce"))
    debounce_max = values.get("lock_debounce_max")
    if debounce is None and debounce_max is not None:
        raise LockConfigurationError(
            f"task {task}: lock_debounce_max={debounce_max!r} bounds a debounce, but "
            "lock_debounce is not set; set lock_debounce too, or remove lock_debounce_max"
        )
    if debounce is not None:
        debounce_max = seconds_of(f"task {task}", "lock_debounce_max", debounce_max, low=0.0)
        if debounce_max is not None and debounce_max < debounce:
            raise LockConfigurationError(
                f"task {task}: lock_debounce_max={debounce_max:g} must be at least "
                f"lock_debounce={debounce:g}: it bounds how long a stream of calls can keep "
                "putting the run off, and one call alone puts it off by lock_debounce"
            )
        if not isinstance(policy, Replace):
            raise LockConfigurationError(
                f"task {task}: lock_debounce={debounce:g} holds each call back and lets the "
                f"newest win, which is on_duplicate='replace', but on_duplicate="
                f"{policy.name!r}; set on_duplicate='replace'"
            )
    if not isinstance(policy, Replace):
        return None, None
    return debounce, debounce_max


def checked_cancel_grace(
    task: str,
    policy: DuplicatePolicy,
    attributes: Mapping[str, Any],
    values: Mapping[str, Any],
    conf: Mapping[str, Any],
) -> float:
    """The task's ``lock_cancel_grace`` in seconds, checked: a task attribute needs a policy
    that restarts (the app setting is left alone for the others). Warns when it is set and the
    app's ``worker_pool`` runs bodies in the worker's own process, where there is no child to
    terminate (the worker warns again when it starts with such a pool).

    Raises:
        LockConfigurationError: naming the task, the option and why.
    """
    value = values["lock_cancel_grace"]  # said as given in the messages below
    seconds = required_seconds_of(f"task {task}", "lock_cancel_grace", value)
    explicit = attributes.get("lock_cancel_grace", UNSET) is not UNSET
    if explicit and not policy.restarts:
        raise LockConfigurationError(
            f"task {task}: lock_cancel_grace={value!r} is how long a call stopped for a newer "
            f"one has, which is on_duplicate='restart', but on_duplicate={policy.name!r}; set "
            "on_duplicate='restart', or remove lock_cancel_grace"
        )
    pool = str(conf.get("worker_pool") or "")
    if policy.restarts and explicit and pool in COOPERATIVE_POOLS:
        log.warning(
            "task %s: lock_cancel_grace=%r has no effect on the %s pool: a restart only asks "
            "the running call to stop (self.request.lock.cancelled); no pool child is "
            "terminated",
            task,
            value,
            pool,
        )
    return seconds
