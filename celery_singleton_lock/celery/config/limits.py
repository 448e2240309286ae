"""``lock_limit``, ``lock_cooldown`` and ``lock_rate``: checked at registration (a limit may
be a callable, checked per call), and what they may not be combined with, each refusal
saying why.

``on_duplicate='queue'`` combines with all three (the engine's slot queue hands each freed
slot, each ended cooldown, each start the rate allows to the oldest parked call).
``'replace'`` does not: "the newest call waits alone" is about one key's one holder, and
with N slots, a cooldown or a rate there is no single release to hand the newest call; a
task that wants the newest call to run takes ``queue`` (every call runs, in order) or
``skip``.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Optional

from celery_singleton_lock.celery.config.options import MAX_TTL, declared_count, seconds_of
from celery_singleton_lock.errors import LockConfigurationError

COOLDOWN_AFTER = ("success", "always")
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([smh]?)\s*$")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}

#: option or policy -> itself and why it has no meaning with more than one holder per key, to
#: follow "does not combine with" (the why in parentheses)
_ONE_HOLDER_ONLY = {
    "join": "on_duplicate='join' (a join waits for THE running execution's outcome, and with "
    "several holders there is no one execution to join)",
    "replace": "on_duplicate='replace' (latest wins: the newest call waits alone for THE "
    "holder's release, and with several holders there is no one release to wait for; "
    "on_duplicate='queue' runs every call in arrival order as slots free)",
    "restart": "on_duplicate='restart' (the newest call stops THE running call and waits "
    "for its release, and with several holders there is no one call to stop)",
    "dedupe_on_enqueue": "dedupe_on_enqueue (it drops a call while its key is queued or "
    "running, which would keep a second holder from ever starting)",
    "lock_min_replicas": "lock_min_replicas (it waits for the replicas of one key's write, and "
    "a limit writes one of several slot keys)",
}


#: the same for a rate
_NOT_WITH_RATE = {
    "join": "on_duplicate='join' (a join waits for THE running execution's outcome, and a call "
    "kept back by the rate has no running execution to join)",
    "replace": "on_duplicate='replace' (latest wins waits for a release, and the rate's window "
    "releases none; on_duplicate='queue' hands parked calls on when the rate allows)",
    "restart": "on_duplicate='restart' (it waits for the stopped call's release, and the "
    "rate's window releases none)",
    "dedupe_on_enqueue": "dedupe_on_enqueue (a call's enqueue marker is cleared when its run "
    "takes the lock, and the rate's acquire does not clear it: the marker would keep every "
    "later call from being sent until lock_queued_ttl; this combination is not supported: "
    "drop the duplicates when they run instead, with on_duplicate='skip', or keep them with "
    "on_duplicate='queue')",
    "lock_min_replicas": "lock_min_replicas (the rate's acquire does not wait for replicas; "
    "this combination is not supported: a rate is kept on the master alone)",
}

#: the same for a cooldown
_NOT_WITH_COOLDOWN = {
    "join": "on_duplicate='join' (a join waits for a running execution, and a cooldown has none)",
    "replace": "on_duplicate='replace' (latest wins hands the newest call a released key, and "
    "a cooldown releases none; on_duplicate='queue' hands parked calls on when the cooldown "
    "ends)",
    "restart": "on_duplicate='restart' (the newest call is handed the stopped call's "
    "released key, and a cooldown releases none)",
}


def _refuse_combined(
    task: str, what: str, reasons: Mapping[str, str], others: Mapping[str, Any]
) -> None:
    """Raise for the first of ``others`` (the task's options) that ``reasons`` refuses."""
    chosen = [str(others.get("on_duplicate")), *(name for name in reasons if others.get(name))]
    for name in chosen:
        if name in reasons:
            raise LockConfigurationError(
                f"task {task}: {what} does not combine with {reasons[name]}; choose one of the two"
            )


#: ``lock_limit``'s declared values (an integer >= 1, or a callable returning one)
_LIMIT = declared_count("lock_limit")


def checked_limit(task: str, value: Any, others: Mapping[str, Any]) -> Any:
    """``value`` of ``lock_limit`` checked: an int >= 1 or a callable; ``others``: the task's
    resolved ``on_duplicate``, ``dedupe_on_enqueue`` and ``lock_min_replicas``.

    Raises:
        LockConfigurationError: naming the task, the option and why.
    """
    if callable(value) and not isinstance(value, type):
        pass
    elif _LIMIT.check(f"task {task}", "lock_limit", value) == 1:
        return 1
    _refuse_combined(task, f"lock_limit={value!r}", _ONE_HOLDER_ONLY, others)
    return value


def checked_cooldown(task: str, value: Any, after: Any, policy: str) -> Any:
    """``lock_cooldown`` (None, or seconds; 0 is None) and ``lock_cooldown_after`` checked,
    with the task's ``on_duplicate``: ``(cooldown or None, after)``.

    Raises:
        LockConfigurationError: naming the task, the option and why.
    """
    if after not in COOLDOWN_AFTER:
        raise LockConfigurationError(
            f"task {task}: lock_cooldown_after={after!r} is not one of "
            f"{', '.join(map(repr, COOLDOWN_AFTER))}"
        )
    seconds = seconds_of(f"task {task}", "lock_cooldown", value)
    if seconds is None:
        return None, after
    if seconds:
        _refuse_combined(
            task, f"lock_cooldown={value!r}", _NOT_WITH_COOLDOWN, {"on_duplicate": policy}
        )
    return (seconds or None), after


def checked_rate(task: str, value: Any, others: Mapping[str, Any]) -> Optional[tuple[int, float]]:
    """``lock_rate`` (None, or ``"N/period"``) as ``(N, seconds)``; ``others``: the task's
    resolved ``on_duplicate``, ``dedupe_on_enqueue`` and ``lock_min_replicas``.

    Raises:
        LockConfigurationError: naming the task, the option and why.
    """
    if value is None:
        return None
    match = _RATE.match(value) if isinstance(value, str) else None
    count = int(match.group(1)) if match else 0
    seconds = float(match.group(2) or 1) * _UNIT[match.group(3)] if match else 0.0
    if (
        not match
        or count < 1
        or not 0.001 <= seconds <= MAX_TTL
        or not (match.group(2) or match.group(3))
    ):
        raise LockConfigurationError(
            f"task {task}: lock_rate={value!r} is not a rate: write 'N/period' with N >= 1 and "
            "a period of s, m, h or a number of seconds ('3/m', '10/30s')"
        )
    _refuse_combined(task, f"lock_rate={value!r}", _NOT_WITH_RATE, others)
    return count, seconds


def limit_for(task: str, limit: Any, keyer: Any, args: Any, kwargs: Any) -> int:
    """The limit of one call: ``limit`` itself, or what the callable ``limit`` returns for the
    call's arguments bound by ``keyer`` (an ``ArgumentKeyer``).

    Raises:
        LockConfigurationError: the callable raised, or returned no integer >= 1 (naming the
            task and the option).
        LockKeyError: the arguments do not fit the task's signature.
    """
    if type(limit) is int:
        return limit
    arguments = keyer.bind(args, kwargs)
    try:
        value = limit(**arguments)
    except Exception as exc:  # the user's code: said as the option's error, naming the task
        raise LockConfigurationError(
            f"task {task}: lock_limit's callable raised {type(exc).__name__}: {exc}"
        ) from exc
    return _LIMIT.check(f"task {task}", "lock_limit's callable", value, "must return")
