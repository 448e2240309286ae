"""A release asked for from the admin: the CLI's safe release (``lock_release.release_lock``),
owner-checked, refused while the holder's worker node answers a ping unless forced, and only
of the holder the page showed. No Django here: it answers in a sentence."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from celery_singleton_lock.celery.cli.app_target import Target
from celery_singleton_lock.celery.cli.lock_listing import (
    describe_holder,
    lock_name_from_key,
    read_slot,
)
from celery_singleton_lock.celery.cli.lock_release import node_is_alive, release_lock
from celery_singleton_lock.errors import LockError

#: What a refusal adds when the page can force a release.
FORCE_HINT = (
    "; if you know that task is not running (a worker stopped without ending it), release "
    'it with "Force release" (the owner check still applies)'
)


@dataclass(frozen=True)
class Outcome:
    released: bool
    #: what happened, for the person who asked
    message: str


def release_from_page(
    target: Target,
    app: Any,
    key: str,
    task_id: str,
    *,
    force: bool,
    ping_timeout: float,
) -> Outcome:
    """Release the key ``key`` (a lock's or one slot's, as the page lists it) if it is still
    held by ``task_id``, the holder the page showed; ``force``: without asking the holder's
    node whether it is alive (the owner check still applies)."""
    try:
        name, slot = lock_name_from_key(target, key)
        holder = read_slot(target, name, slot)
        if holder is None:
            return Outcome(False, f"lock {key} is free now: nothing to release")
        if holder.task_id != task_id:
            return Outcome(
                False,
                f"lock {key} changed hands since the page was shown (now held by "
                f"{describe_holder(holder)}): nothing released",
            )
        outcome = release_lock(
            target,
            name,
            is_alive=None if force else lambda node: node_is_alive(app, node, ping_timeout),
            slot=slot,
            hint=FORCE_HINT,
        )
    except LockError as exc:  # ReleaseRefused among them: the holder's node answered
        return Outcome(False, f"not released: {exc}")
    if not outcome.released:
        return Outcome(False, f"lock {key} changed hands or was freed meanwhile: nothing released")
    how = "forced: its node was not asked" if force else "its node did not answer a ping"
    said = f"lock {key} released (held by {describe_holder(holder)}; {how})"
    if outcome.parked:
        said += (
            f"; {outcome.parked} call(s) parked behind it: a worker's hand-off sweeper hands "
            "the lock to the oldest at its next sweep"
        )
    return Outcome(True, said)
