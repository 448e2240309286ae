"""Checks of "latest wins": policy ``replace`` and ``lock_debounce``/``lock_debounce_max``,
refused at registration when they contradict the task's other options, naming the task."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from celery_singleton_lock.celery.config.options import MAX_TTL
from celery_singleton_lock.errors import LockConfigurationError


def _seconds(task: str, name: str, value: Any, low: float, too_low: str) -> Optional[float]:
    """``value`` of option ``name``: None, or seconds from ``low`` to MAX_TTL (``too_low``:
    what is said of a value below ``low``, after ``name=value``)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value == value:
        raise LockConfigurationError(
            f"task {task}: {name} must be None or a number of seconds, got {value!r}"
        )
    if value > MAX_TTL:
        raise LockConfigurationError(
            f"task {task}: {name}={value!r} is out of range; use {low:g} to {MAX_TTL:g} seconds"
        )
    if value < low:
        raise LockConfigurationError(f"task {task}: {name}={value!r} {too_low}")
    return float(value)


def check_latest_wins(
    task: str,
    on_duplicate: str,
    values: Mapping[str, Any],
    *,
    dedupe: bool,
    finished_ttl: Optional[float],
) -> tuple[Optional[float], Optional[float]]:
    """The task's ``lock_debounce`` and ``lock_debounce_max``, checked with its policy.

    ``replace`` runs the newest duplicate after the running one: it cannot also drop
    duplicates at enqueue (the newest would be dropped), and it needs the finish record that
    keeps a hand-off sent twice from running twice. A debounce is a way of replacing.

    Raises:
        LockConfigurationError: naming the task and the options that contradict each other.
    """
    debounce = _seconds(
        task,
        "lock_debounce",
        values.get("lock_debounce"),
        0.05,
        f"is out of range; use 0.05 to {MAX_TTL:g} seconds",
    )
    debounce_max = values.get("lock_debounce_max")
    if debounce is None and debounce_max is not None:
        raise LockConfigurationError(
            f"task {task}: lock_debounce_max={debounce_max!r} bounds a debounce, but "
            "lock_debounce is not set; set lock_debounce too, or remove lock_debounce_max"
        )
    if debounce is not None:
        debounce_max = _seconds(
            task,
            "lock_debounce_max",
            debounce_max,
            debounce,
            f"must be at least lock_debounce={debounce:g}: it bounds how long a stream of calls "
            "can keep putting the run off, and one call alone puts it off by lock_debounce",
        )
        if on_duplicate != "replace":
            raise LockConfigurationError(
                f"task {task}: lock_debounce={debounce:g} holds each call back and lets the "
                f"newest win, which is on_duplicate='replace', but on_duplicate="
                f"{on_duplicate!r}; set on_duplicate='replace'"
            )
    if on_duplicate != "replace":
        return None, None
    if dedupe:
        raise LockConfigurationError(
            f"task {task}: on_duplicate='replace' runs the newest duplicate once the running "
            "call ends, but dedupe_on_enqueue=True drops every newer call before it is "
            "queued; choose one of the two"
        )
    if finished_ttl is None:
        raise LockConfigurationError(
            f"task {task}: on_duplicate='replace' needs lock_finished_ttl (it keeps a waiting "
            "call that was handed the lock twice from running twice); set it to a number of "
            "seconds (default 3600) or choose another on_duplicate"
        )
    return debounce, debounce_max
