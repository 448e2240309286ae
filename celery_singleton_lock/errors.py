"""The ``LockError`` family.

Every exception keeps all of its fields in ``args`` so that it survives both a pickle round
trip and Celery's JSON result serializer (which rebuilds an exception as ``cls(*args)``);
``str()`` is always the human message alone.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

__all__ = [
    "AlreadyFinished",
    "AlreadySuperseded",
    "DuplicateTaskError",
    "DuplicateTaskSkipped",
    "LockBackendUnavailable",
    "LockConfigurationError",
    "LockError",
    "LockKeyError",
    "LockLostError",
    "LockNotOwnedError",
    "ReplicasUnavailable",
    "StaleFenceError",
    "UnsupportedArgumentError",
]


class LockError(Exception):
    """Base of every error this package raises.

    Attributes:
        message: what went wrong and what to do about it.
        key: the Redis lock key concerned, when there is one.
        holder: who holds the lock (task id, host, pid, remaining TTL...), when known.
    """

    def __init__(
        self,
        message: str,
        key: Optional[str] = None,
        holder: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__(message, key, dict(holder) if holder is not None else None)

    @property
    def message(self) -> str:
        return str(self.args[0])

    @property
    def key(self) -> Optional[str]:
        return self.args[1] if len(self.args) > 1 else None

    @property
    def holder(self) -> Optional[dict[str, Any]]:
        return self.args[2] if len(self.args) > 2 else None

    def __str__(self) -> str:
        return self.message


class LockBackendUnavailable(LockError):
    """The lock server could not be reached (connection refused, timeout, auth, OOM...)."""


class ReplicasUnavailable(LockBackendUnavailable):
    """The lock was written, but fewer replicas than asked (``lock_min_replicas``) acknowledged
    it in time, so it was released again. Lasts while the server has too few replicas
    attached (after a failover the promoted replica has none until one is attached)."""


class AlreadyFinished(LockError):
    """The owner's task id already ran to the end under this lock (a recorded release): an
    acquire that asked for it (``unless_finished``) took nothing. Seen by a redelivered copy
    of a finished task."""


class AlreadySuperseded(LockError):
    """The owner's task id was displaced by a newer call of its lock (policy ``replace``, a
    debounce): an acquire by it took nothing. Seen by a stale copy of a superseded call (its
    message delivered again, or to a worker that missed the revoke)."""


class LockNotOwnedError(LockError):
    """An operation needed a lock we do not (or no longer) own."""


class LockLostError(LockNotOwnedError):
    """The lease expired or was taken over while its holder was still running."""


class LockConfigurationError(LockError, ValueError):
    """A task's lock options or an app setting is invalid; raised at registration/worker start."""


class LockKeyError(LockError, TypeError):
    """A lock key could not be computed from a call's arguments."""


class UnsupportedArgumentError(LockKeyError):
    """An argument has a type with no stable canonical encoding."""


class DuplicateTaskError(LockError):
    """A duplicate execution found the lock held (policy ``fail``, or lock retries spent)."""


class DuplicateTaskSkipped(DuplicateTaskError):
    """Outcome stored for a duplicate that was skipped (policy ``skip``).

    ``AsyncResult.get()`` raises it promptly; ``holder['task_id']`` names the execution that
    held the lock.
    """


class StaleFenceError(LockError):
    """A write made conditional on a lock's fence was refused by the database: the row (or
    the resource's fence record) already carries a higher fence, so a newer lock holder wrote
    it and this holder's lock was lost. Raised by the fenced-write helpers of
    ``celery_singleton_lock.contrib`` (nothing was written); retrying the task takes a new lock
    and a new fence.

    ``key`` names the row or resource; ``holder`` is ``{"fence": the refused fence, "seen":
    the fence the row carries}``.
    """

    @property
    def fence(self) -> Optional[int]:
        return (self.holder or {}).get("fence")

    @property
    def seen(self) -> Optional[int]:
        return (self.holder or {}).get("seen")
