"""Drop-in replacements for celery-once's ``QueueOnce`` and celery-singleton's ``Singleton``.

Both are :class:`~celery_singleton_lock.LockedTask` subclasses with ``dedupe_on_enqueue`` on:
a duplicate is refused when it is sent (as with the originals), and the execution that runs
holds the renewed run-time lock, so a crashed worker blocks its key for ``lock_ttl`` (15 s by
default), not for the original's hour, and a task running longer than its timeout keeps its
lock. Their options are read as the originals read them (celery-once's ``blocking`` setting
too); the lock server is this package's (``singleton_lock_url``, else the broker), not
celery-once's ``ONCE["settings"]["url"]`` nor ``singleton_backend_url``: a ``QueueOnce`` app
with an ``ONCE`` setting and no Redis of its own is refused, naming ``singleton_lock_url``.

A duplicate is refused wherever the original refuses it: sent with ``link``/``link_error``,
as the first step of a chain, or as a member of a group or chord (``QueueOnce`` raises
:class:`AlreadyQueued` out of the canvas's ``apply_async``; ``Singleton`` publishes nothing
and returns the existing task's ``AsyncResult``, which the canvas drops: that member never
runs, as with the original). One case differs on purpose: a duplicate that a worker sends as
the callback or next chain step of the task it has just run is dropped with a WARNING in
both. The originals raise there (``QueueOnce`` always, ``Singleton`` with
``raise_on_duplicate``), inside Celery's tracer, which turns the exception into a FAILURE of
the task that ran although its body succeeded.

celery-singleton's settings: ``singleton_lock_expiry`` (seconds a queued call blocks
duplicates, as ``lock_expiry``), ``singleton_key_prefix`` (put in front of the lock name of
every ``Singleton`` task; the key's own prefix stays ``singleton_lock_prefix``) and
``singleton_raise_on_duplicate`` are honoured. Without a meaning here: ``singleton_backend_url``,
``singleton_backend_class`` and ``singleton_backend_kwargs`` (one lock server and client per
app, shared by every locked task: ``singleton_lock_url``, ``singleton_lock_redis_options``;
reading celery-singleton's would move the locks of an app running both packages), and
``singleton_json_encoder_class`` (not in 0.3.1; lock names hash the arguments with a
canonical encoding, not JSON).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from typing import Any, Mapping, Optional, Sequence

from celery import states
from celery.result import EagerResult

from celery_singleton_lock.celery.config.lockers import locker_for
from celery_singleton_lock.celery.config.options import UNSET
from celery_singleton_lock.celery.config.resolution import LockOptions, queued_seconds
from celery_singleton_lock.celery.config.servers import choose_url
from celery_singleton_lock.celery.config.urls import redact_loosely
from celery_singleton_lock.celery.duplicates import enqueue
from celery_singleton_lock.celery.task.locked_task import LockedTask
from celery_singleton_lock.engine import LockBackend, LockKeys, PartsReader
from celery_singleton_lock.errors import DuplicateTaskError as _DuplicateTaskError
from celery_singleton_lock.errors import LockConfigurationError, LockError

__all__ = ["AlreadyQueued", "DuplicateTaskError", "QueueOnce", "Singleton", "clear_locks"]

log = logging.getLogger("celery_singleton_lock.compat")


class AlreadyQueued(LockError):
    """celery-once's ``AlreadyQueued``: the call is already queued or running.

    Attributes:
        countdown: seconds (to the millisecond, as celery-once gives them) until the call's
            lock would expire under celery-once's ``timeout``: for a queued call, what is left
            of it (the marker's TTL); for a running one, the timeout less the time it has run
            (celery-once counts from the enqueue), never less than the running lock's own TTL
            (ours keeps the lock of a run that outlasts its timeout); 0 if it ended meanwhile.
    """

    def __init__(
        self, countdown: float, key: Optional[str] = None, task_id: Optional[str] = None
    ) -> None:
        super().__init__(
            f"Expires in {countdown} seconds", key, {"task_id": task_id} if task_id else None
        )
        self.args = (countdown, key, task_id)

    @property
    def message(self) -> str:
        return f"Expires in {self.args[0]} seconds"

    @property
    def countdown(self) -> float:
        return float(self.args[0])

    @property
    def key(self) -> Optional[str]:
        return str(self.args[1]) if self.args[1] is not None else None

    @property
    def holder(self) -> Optional[dict[str, Any]]:
        return {"task_id": self.args[2]} if self.args[2] else None


class DuplicateTaskError(_DuplicateTaskError):
    """celery-singleton's ``DuplicateTaskError``: ``task_id`` is the task already queued or
    running (raised with ``raise_on_duplicate``)."""

    def __init__(self, message: str, task_id: str, key: Optional[str] = None) -> None:
        super().__init__(message, key, {"task_id": task_id})
        self.args = (message, task_id, key)

    @property
    def task_id(self) -> str:
        return str(self.args[1])

    @property
    def key(self) -> Optional[str]:
        return str(self.args[2]) if self.args[2] is not None else None

    @property
    def holder(self) -> Optional[dict[str, Any]]:
        return {"task_id": self.args[1]}


def _one_per_task(*_: Any, **__: Any) -> str:
    return "all-calls"


def _keys_to_lock_on(task_name: str, keys: Any) -> tuple[Optional[Sequence[str]], Any]:
    """``(lock_on, lock_key)`` for celery-once's ``keys``: None for all arguments, ``[]``
    for one lock per task whatever the arguments."""
    if keys is None:
        return None, None
    if isinstance(keys, str) or not isinstance(keys, (list, tuple)):
        raise LockConfigurationError(
            f"task {task_name}: once['keys'] must be a list of parameter names, got {keys!r}"
        )
    return (tuple(keys), None) if keys else (None, _one_per_task)


def _countdown(locker: LockBackend, name: str, timeout: float) -> float:
    """:attr:`AlreadyQueued.countdown` for lock ``name`` (see there)."""
    markers = locker.markers
    remaining = None if markers is None else markers.queued_for(name)
    if remaining is not None:
        return remaining
    holder = locker.inspect.read(name)
    if holder is None:
        return 0.0
    if holder.acquired_at is None:
        return timeout
    left = timeout - (time.time() - holder.acquired_at)
    return round(max(left, holder.ttl or 0.0), 3)


def _not_sent(task: LockedTask, existing: str, name: str) -> None:
    log.warning(
        "task %s: callback or chain step not sent: lock %s is already queued or running as %s",
        task.name,
        name,
        existing,
    )


def _once_settings(app: Any) -> Mapping[str, Any]:
    """``ONCE["settings"]`` of ``app`` (celery-once's own setting), empty if not set."""
    return (app.conf.get("ONCE") or {}).get("settings") or {}


#: celery-once's Redis backend, the one whose locks QueueOnce's Redis locks stand for.
ONCE_REDIS_BACKEND = "celery_once.backends.Redis"


class QueueOnce(LockedTask):
    """celery-once's ``QueueOnce``: ``delay`` / ``apply_async`` of a call that is already
    queued or running raises :class:`AlreadyQueued` (with ``graceful``, returns an
    ``EagerResult`` in state ``REJECTED``, as celery-once 3.0.1 does).

    ``once`` (task option, and per call ``apply_async(..., once={...})`` for ``graceful``
    and ``timeout``): ``keys`` (parameters the lock is on; ``[]``: one per task), ``graceful``,
    ``timeout`` (seconds a queued call blocks duplicates if it never runs; default the
    ``ONCE`` setting's ``default_timeout``, else 3600), ``unlock_before_run`` (a call sent
    while one runs is queued, and runs after it: ``on_duplicate="retry"``).
    """

    abstract = True
    once: Mapping[str, Any] = {"graceful": False, "unlock_before_run": False}

    dedupe_on_enqueue = True

    @classmethod
    def on_bound(cls, app: Any) -> None:
        once = dict(cls.once or {})
        name = cls.name or cls.__qualname__
        if cls.lock_on is None and cls.lock_key is None:
            cls.lock_on, cls.lock_key = _keys_to_lock_on(name, once.get("keys"))
        if cls.lock_queued_ttl is UNSET:
            settings = _once_settings(app)
            cls.lock_queued_ttl = once.get("timeout", settings.get("default_timeout", 3600))
        if once.get("unlock_before_run") and cls.on_duplicate is UNSET:
            cls.on_duplicate = "retry"
        super().on_bound(app)

    @classmethod
    def _resolve_options(cls, app: Any, name: str) -> LockOptions:
        options = super()._resolve_options(app, name)
        once = app.conf.get("ONCE") or {}
        if once.get("backend") and choose_url(app.conf)[1] == "default":
            # The app names no Redis of its own: the default URL would send the locks to
            # whatever answers on localhost:6379, silently. celery-once's own server is not
            # read (one lock server per app serves every locked task, QueueOnce or not).
            backend = once["backend"]
            url = redact_loosely(str((once.get("settings") or {}).get("url")))
            where = (
                f"its ONCE settings' url ({url}) is celery-once's, not read here"
                if backend == ONCE_REDIS_BACKEND
                else f"celery-once's ONCE backend {backend!r} keeps its locks outside Redis"
            )
            raise LockConfigurationError(
                f"task {name}: QueueOnce keeps its locks in Redis, and this app names none (no "
                f"singleton_lock_url, no Redis broker or result backend); {where}: set "
                "singleton_lock_url to the Redis the locks go to"
            )
        return options

    def enqueue_dedupe(self, options: dict[str, Any]) -> Optional[enqueue.Dedupe]:
        per_call = options.pop("once", None) or {}
        dedupe = super().enqueue_dedupe(options)
        if dedupe is None:
            return None
        once = {**(self.once or {}), **per_call}
        settings = _once_settings(self.app)
        graceful = bool(once.get("graceful", False))
        ttl = float(per_call.get("timeout", dedupe.queued_ttl))
        by_worker = enqueue.sent_by_worker(self.app, options)

        def on_duplicate(existing: str, name: str) -> Any:
            if graceful or by_worker:
                if by_worker:
                    _not_sent(self, existing, name)
                return EagerResult(None, None, states.REJECTED)
            locker = locker_for(self.app)
            raise AlreadyQueued(_countdown(locker, name, ttl), locker.keys(name).lock, existing)

        return enqueue.Dedupe(
            queued_ttl=ttl,
            on_duplicate=on_duplicate,
            running_is_duplicate=not once.get("unlock_before_run", False),
            canvas=True,
            # celery-once's Redis backend: a duplicate waits up to blocking_timeout (default
            # 1 s) for the call before it to end, then is published (or AlreadyQueued)
            wait=float(settings.get("blocking_timeout", 1)) if settings.get("blocking") else 0.0,
        )


class Singleton(LockedTask):
    """celery-singleton's ``Singleton``: ``delay`` / ``apply_async`` of a call that is
    already queued or running returns that task's ``AsyncResult`` (or raises
    :class:`DuplicateTaskError` with ``raise_on_duplicate``).

    ``unique_on`` (a parameter name or a list of them; default all), ``raise_on_duplicate``
    (default: the ``singleton_raise_on_duplicate`` setting, else False), ``lock_expiry``
    (seconds a queued call blocks duplicates if it never runs; default: the
    ``singleton_lock_expiry`` setting, else ``lock_queued_ttl``'s 3600). The setting
    ``singleton_key_prefix`` is put in front of the lock names (see the module docstring).
    """

    abstract = True
    unique_on: Any = None
    raise_on_duplicate: Optional[bool] = None
    lock_expiry: Optional[float] = None

    dedupe_on_enqueue = True

    @classmethod
    def on_bound(cls, app: Any) -> None:
        if cls.unique_on and cls.lock_on is None and cls.lock_key is None:
            unique_on = cls.unique_on
            cls.lock_on = (unique_on,) if isinstance(unique_on, str) else tuple(unique_on)
        super().on_bound(app)

    @classmethod
    def _resolve_options(cls, app: Any, name: str) -> LockOptions:
        options = super()._resolve_options(app, name)
        changes: dict[str, Any] = {}
        if cls.lock_queued_ttl is UNSET:
            expiry, source = cls.lock_expiry, "lock_expiry"
            if expiry is None:
                expiry, source = app.conf.get("singleton_lock_expiry"), "singleton_lock_expiry"
            if expiry is not None:
                changes["queued_ttl"] = queued_seconds(name, source, expiry)
        namespace = app.conf.get("singleton_key_prefix")
        if namespace:
            changes["keyer"] = keyer = copy.copy(options.keyer)
            keyer.namespace = _key_prefix(name, options.prefix, namespace)
        return dataclasses.replace(options, **changes) if changes else options

    def enqueue_dedupe(self, options: dict[str, Any]) -> Optional[enqueue.Dedupe]:
        dedupe = super().enqueue_dedupe(options)
        if dedupe is None:
            return None
        raises = self.raise_on_duplicate
        if raises is None:
            raises = bool(self.app.conf.get("singleton_raise_on_duplicate") or False)
        by_worker = enqueue.sent_by_worker(self.app, options)

        def on_duplicate(existing: str, name: str) -> Any:
            if by_worker:
                _not_sent(self, existing, name)
            elif raises:
                raise DuplicateTaskError(
                    f"Attempted to queue a duplicate of task ID {existing}",
                    existing,
                    locker_for(self.app).keys(name).lock,
                )
            return self.AsyncResult(existing)

        return dataclasses.replace(dedupe, on_duplicate=on_duplicate, canvas=True)


def _key_prefix(task_name: str, prefix: str, namespace: Any) -> str:
    """``singleton_key_prefix`` validated as the start of the task's lock names."""
    try:
        if not isinstance(namespace, str):
            raise LockConfigurationError(f"it must be a string, got {namespace!r}")
        LockKeys.build(prefix, f"{namespace}{task_name}:{'0' * 64}")
    except LockConfigurationError as exc:
        raise LockConfigurationError(
            f"task {task_name}: singleton_key_prefix={namespace!r} cannot start its lock "
            f"names: {exc.message}"
        ) from None
    return namespace


def clear_locks(app: Any) -> int:
    """celery-singleton's ``clear_locks``: let the next call of every ``Singleton`` task of
    ``app`` be published again; the number of calls cleared.

    celery-singleton deletes every key under its ``singleton_key_prefix``, the locks of running
    tasks included (another worker's too, so a duplicate may then run beside them). Here a
    lock a worker holds is never touched: it is renewed while its holder lives and expires
    within ``lock_ttl`` once it is gone, so there is nothing stale to delete. What is cleared
    is each queued marker (the call sent but not yet started, which blocks duplicates for
    ``lock_expiry``) of the app's ``Singleton`` tasks, compare-and-delete by task id: what a
    purged queue or a worker lost before it started a call leaves behind. A call still
    waiting in the queue loses its marker as it does in celery-singleton; a duplicate sent
    then is published, yet never runs beside it (the run-time lock).

    Raises:
        LockBackendUnavailable: the lock server could not be reached.
        LockConfigurationError: a ``Singleton`` task's options are invalid.
    """
    starts = tuple(
        f"{task.lock_options.keyer.namespace}{task.name}:"
        for task in list(app.tasks.values())
        if isinstance(task, Singleton) and task.name
    )
    if not starts:
        return 0
    locker = locker_for(app)
    markers, inspector = locker.markers, locker.inspect
    # a backend that keeps no markers (a quorum) has none to clear
    if markers is None or not isinstance(inspector, PartsReader):
        return 0
    cleared = 0
    for name in list(inspector.queued_names()):
        if not name.startswith(starts):
            continue
        task_id = markers.queued(name)
        if task_id is not None and markers.clear_queued(name, task_id):
            cleared += 1
    return cleared
