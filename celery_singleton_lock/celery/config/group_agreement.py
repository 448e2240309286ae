"""``lock_group``: a group's tasks checked against one another at worker start.

The tasks of one group share each lock their calls name (``ArgumentKeyer``: the group heads
the name instead of the task), so they must agree on everything the lock's scripts are chosen
from: the limit, the cooldown, the rate, whether a duplicate parks (``on_duplicate='queue'``),
which arguments identify the work, and how parked calls are ordered (``lock_fair_by``). A
task cannot see the others as it registers (they register one by one, from modules imported
in any order), so the comparison waits for the worker's start, when every task is
registered; a disagreement refuses the start, naming both tasks and the option. Policies that
differ only in what the duplicate itself does (``skip``, ``retry``, ``wait``, ``fail``) may
be mixed: the lock is the same.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

from celery_singleton_lock.celery.config.resolution import LockOptions
from celery_singleton_lock.errors import LockConfigurationError


def _identified_by(options: LockOptions) -> Any:
    """What names a call's lock within the group: its ``lock_on`` names (in any order), all
    the parameters (``lock_on`` unset), or the ``lock_key`` callable's string."""
    keyer = options.keyer
    if keyer.lock_key is not None:
        return "lock_key"
    names = keyer.signature.parameters if keyer.lock_on is None else keyer.lock_on
    return tuple(sorted(names))


def _cooldown_after(options: LockOptions) -> Optional[str]:
    return options.cooldown_after if options.cooldown is not None else None


def _on_duplicate(options: LockOptions) -> bool:
    return options.policy.parks


#: option -> what of a task's options must be equal across its group (a value, compared
#: with ==; a callable lock_limit is equal to itself only)
_SHARED: dict[str, Callable[[LockOptions], Any]] = {
    "lock_limit": lambda options: options.limit,
    "lock_cooldown": lambda options: options.cooldown,
    "lock_cooldown_after": _cooldown_after,
    "lock_rate": lambda options: options.rate,
    "on_duplicate": _on_duplicate,
    "lock_on": _identified_by,
    "lock_fair_by": lambda options: (
        None if options.fair_keyer is None else tuple(sorted(options.fair_keyer.lock_on or ()))
    ),
}

#: why each must be equal, for the error
_WHY = {
    "on_duplicate": "either every task of a group parks its duplicates ('queue') or none "
    "does: a release hands the lock on to a parked call only when its holder's task parks",
    "lock_fair_by": "the calls parked behind a group's lock are ordered one way: fairly "
    "across the same arguments for every task, or in arrival order for all",
    "lock_on": "the calls of a group share a lock when the arguments of the same names are "
    "equal, so every task must name the same ones (lock_on=() for one lock per group)",
}


def check_groups(tasks: Iterable[tuple[str, LockOptions]]) -> None:
    """Refuse a group whose tasks disagree on an option of the lock they share.

    Args:
        tasks: (task name, its resolved options) of every locked task of the app.

    Raises:
        LockConfigurationError: naming the group, both tasks, the option and both values.
    """
    first: dict[str, tuple[str, LockOptions]] = {}
    for name, options in sorted(tasks, key=lambda task: task[0]):
        group = options.keyer.group
        if group is None:
            continue
        if group not in first:
            first[group] = (name, options)
            continue
        other, theirs = first[group]
        for option, value_of in _SHARED.items():
            mine, its = value_of(options), value_of(theirs)
            if mine != its:
                shown = (
                    (theirs.on_duplicate, options.on_duplicate)
                    if option == "on_duplicate"
                    else (its, mine)
                )
                why = _WHY.get(option, f"they share one lock, and with it its {option}")
                raise LockConfigurationError(
                    f"lock_group {group!r}: tasks {other} and {name} declare different "
                    f"{option} ({shown[0]!r} and {shown[1]!r}); {why}: declare the same "
                    f"{option} on both, or give them different groups"
                )
