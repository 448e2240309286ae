"""``lock_group`` checked at a task's registration: a name that can head a lock name, and a
policy that can serve a group.

The tasks of one group share each lock their calls name (``ArgumentKeyer``: the group heads
the name instead of the task). Whether they agree with one another is checked at worker start
(:mod:`.group_agreement`), once every task is registered.
"""

from __future__ import annotations

from typing import Any, Optional

from celery_singleton_lock.engine import LockKeys
from celery_singleton_lock.errors import LockConfigurationError


def checked_group(task_name: str, group: Any, prefix: str, policy: Any) -> Optional[str]:
    """``lock_group`` validated for the task ``task_name``: None, or a name that can head a
    lock name under ``prefix``.

    Raises:
        LockConfigurationError: naming the task, the option and what to do.
    """
    if group is None:
        return None
    if not isinstance(group, str) or not group:
        raise LockConfigurationError(
            f"task {task_name}: lock_group must be None or a non-empty string naming the "
            f"group, got {group!r}"
        )
    try:
        LockKeys.build(prefix, f"{group}:{'0' * 64}")
    except LockConfigurationError as exc:
        raise LockConfigurationError(
            f"task {task_name}: lock_group={group!r} cannot head a lock name: {exc.message}"
        ) from None
    if policy.not_in_a_group:  # the policy (a DuplicatePolicy) says why it cannot serve one
        raise LockConfigurationError(
            f"task {task_name}: lock_group does not combine with on_duplicate="
            f"{policy.name!r} ({policy.not_in_a_group}); "
            "choose 'queue', 'skip', 'retry', 'wait' or 'fail', or leave the task out of "
            "the group"
        )
    return group
