"""``LockedTask``: a Celery task base that runs at most one execution per lock key at a time."""

from __future__ import annotations

import functools
import inspect
import logging
import os
import socket
import threading
from typing import Any, Callable, NoReturn, Optional, Sequence

from celery import VERSION as CELERY_VERSION
from celery import Task, states
from celery.app.task import Context
from celery.exceptions import Ignore, Reject, Retry

from ..engine import Lease, LockHolder, Owner, RedisLocker
from ..errors import AlreadyFinished, DuplicateTaskError, LockBackendUnavailable
from . import policies
from .connection import locker_for
from .handle import LockHandle
from .options import TASK_OPTIONS, UNSET, LockOptions, resolve
from .signals import lock_acquired, lock_lost, lock_released

log = logging.getLogger("celery_singleton_lock.acquire")
log_release = logging.getLogger("celery_singleton_lock.release")

_HOSTNAME = socket.gethostname()

# ``self.request.lock`` must be request state, not a message header: Celery turns every
# request attribute that Context does not declare into a custom header when it copies a
# request (``push_request``), and would then try to serialize the handle into messages.
# Declaring it also gives direct calls ``self.request.lock is None``.
if not hasattr(Context, "lock"):
    Context.lock = None
_ATTRIBUTES = (*TASK_OPTIONS, "lock_on", "lock_key")


class _HeldHere(threading.local):
    """Locks held by runs in this thread, by lock name: what makes nested runs reentrant."""

    def __init__(self) -> None:
        self.by_name: dict[str, LockHandle] = {}


_held_here = _HeldHere()


def _push_request_copying_the_current(task: Task, *args: Any, **kwargs: Any) -> None:
    """``Task.push_request`` as Celery 5.5 made it, for Celery 5.3 and 5.4.

    An overridden ``__call__`` (``LockedTask`` has one) ends in ``Task.__call__``, which pushes
    a new request for the body. Before 5.5 that request started empty, so outside the
    optimized worker path (eager runs, ``start_worker``) the body saw ``self.request.id`` and
    ``self.request.lock`` as None. From 5.5 it starts as a copy of the current request.
    """
    task.request_stack.push(Context(*args, **{**task.request.__dict__, **kwargs}))


def _releasing_lock(call: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a task's ``__call__`` so that the lock taken in ``before_start`` is released as
    the body ends, however it ends."""

    @functools.wraps(call)
    def __call__(self: LockedTask, *args: Any, **kwargs: Any) -> Any:
        request = self.request_stack.top
        handle: Optional[LockHandle] = getattr(request, "lock", None)
        owns = handle is not None and handle.lease is not None and not handle.body_entered
        if owns:
            handle.body_entered = True  # type: ignore[union-attr]  # nested calls leave it
        finished = False
        try:
            result = call(self, *args, **kwargs)
            finished = True
            return result
        except (Retry, Ignore, Reject):
            raise  # not a finished execution: a retry, or a message meant to come back
        except Exception:
            finished = True  # a failure is an outcome too
            raise
        finally:
            if owns:
                # Without waiting for the reply, unless successors (callbacks, chain steps)
                # or an eager caller come next: they must find the lock free.
                self.release_lock(request, wait=self._successors_follow(request), finished=finished)

    __call__.releases_lock = True  # type: ignore[attr-defined]
    return __call__


class LockedTask(Task):  # type: ignore[misc]
    """Task base class: the worker takes a per-argument Redis lock before the body runs.

    The lock is taken in ``before_start`` (so beat, ``send_task``, retries and redelivery are
    all covered), renewed by a worker-side thread while the body runs, and released after it
    on every exit path. The body sees its lock as ``self.request.lock`` (a
    :class:`~celery_singleton_lock.celery.handle.LockHandle`).

    Every ``lock_*`` attribute left unset takes the app setting ``singleton_lock_<name>``
    (e.g. ``singleton_lock_ttl``), else the default shown. A direct call ``task(...)`` runs
    the body in the caller without any lock (Celery does not run ``before_start`` there).
    """

    #: Seconds the lock lives without renewal (default 15). The worker renews it every third
    #: of that while the body runs, so it does not limit how long the task may run; it bounds
    #: how long a killed worker's lock keeps blocking the key.
    lock_ttl: Any = UNSET

    #: What a duplicate does when the lock is held (default ``"skip"``):
    #: ``"skip"`` ends it without running the body (``AsyncResult.get()`` raises
    #: ``DuplicateTaskSkipped`` naming the holder); ``"retry"`` sends it again after a
    #: jittered exponential backoff; ``"wait"`` blocks the worker slot until the release (up to
    #: ``lock_wait_timeout``), then retries; ``"fail"`` raises ``DuplicateTaskError``.
    on_duplicate: Any = UNSET

    #: Names of the parameters that identify the work, e.g. ``("account_id",)``. Default: all
    #: parameters, bound to the signature with defaults applied.
    lock_on: Optional[Sequence[str]] = None

    #: Callable taking the task's arguments and returning the lock name as a string, for full
    #: control (exclusive with ``lock_on``).
    lock_key: Optional[Callable[..., str]] = None

    #: Hand out a fencing token per acquisition (``self.request.lock.fence``), strictly
    #: increasing per key, for stores to reject writes from a holder that lost its lock.
    #: Default False.
    lock_fencing: Any = UNSET

    #: Base of the lock-retry backoff in seconds (default 1.0); attempt ``n`` waits a uniform
    #: random time in ``[0, min(lock_retry_backoff_max, base * 2**n))``.
    lock_retry_backoff: Any = UNSET

    #: Cap of the lock-retry backoff in seconds (default 60).
    lock_retry_backoff_max: Any = UNSET

    #: Lock-retry budget, separate from the task's own ``max_retries`` (default None: retry
    #: until acquired, so no duplicate is ever dropped). When spent: ``DuplicateTaskError``.
    lock_max_retries: Any = UNSET

    #: Seconds policy ``"wait"`` blocks the worker slot before falling back to a retry
    #: (default 30).
    lock_wait_timeout: Any = UNSET

    #: When the lock server cannot be reached at ``before_start``: ``"retry"`` (default:
    #: send the task again later; nothing is lost) or ``"run"`` (run without the lock).
    lock_on_backend_error: Any = UNSET

    #: For ``acks_late`` tasks: seconds the lock remembers that a task id ran to the end
    #: (default 3600, the Redis broker's default ``visibility_timeout``). A redelivered copy
    #: of that task id taking the lock meanwhile is dropped, in the acquire's own round trip.
    #: Costs one small key per finished task for that long; keep it at least the broker's
    #: ``visibility_timeout``. None turns it off (e.g. if the same task id is sent again on
    #: purpose, as a dead-letter replay does).
    lock_finished_ttl: Any = UNSET

    #: Celery's ``track_started`` (task attribute or ``task_track_started``), taken over by
    #: the lock: STARTED is stored once the lock is held, not before ``before_start`` as the
    #: tracer does, so a duplicate that is skipped or retried never shows STARTED, and a
    #: redelivered copy of a finished execution cannot overwrite its outcome with STARTED
    #: (the tracer stores it by reading, then writing the state).
    lock_track_started: bool = False

    _lock_options: Optional[LockOptions] = None

    # -- configuration -----------------------------------------------------------------------

    @classmethod
    def on_bound(cls, app: Any) -> None:
        super().on_bound(app)
        if not issubclass(DuplicateTaskError, tuple(cls.throws)):
            # an expected outcome: logged without a traceback
            cls.throws = (*tuple(cls.throws), DuplicateTaskError)
        if cls.track_started:  # resolved from the settings by bind(); see lock_track_started
            cls.lock_track_started, cls.track_started = True, False
        cls.resolve_lock_options(app)

    @classmethod
    def resolve_lock_options(cls, app: Any) -> Optional[LockOptions]:
        """Validate and cache this task's lock options (at registration and worker start).

        Raises:
            LockConfigurationError: naming the task and the bad option.
        """
        if not cls.name:
            return None
        run = inspect.getattr_static(cls, "run")
        func = run.__func__ if isinstance(run, staticmethod) else run
        cls._lock_options = resolve(
            task_name=cls.name,
            func=func,
            skip_first=not isinstance(run, staticmethod),
            attributes={name: getattr(cls, name) for name in _ATTRIBUTES},
            conf=app.conf,
            time_limit=cls.time_limit,
        )
        return cls._lock_options

    @property
    def lock_options(self) -> LockOptions:
        """This task's resolved lock options."""
        options = type(self)._lock_options or type(self).resolve_lock_options(self.app)
        assert options is not None
        return options

    @property
    def lock_locker(self) -> RedisLocker:
        """The engine locker this task's app uses."""
        return locker_for(self.app)

    # -- acquire: the hot path ---------------------------------------------------------------

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        options = self.lock_options
        request = self.request
        name = options.keyer.name(args, kwargs)
        outer = _held_here.by_name.get(name)
        if outer is not None:
            request.lock = outer.nested()
            return

        # A redelivered message of an acks_late task may repeat an execution that already
        # ran to the end: the acquire itself looks for that execution's finish record.
        unless_finished = bool(self.acks_late and task_id and options.finished_ttl)

        def acquire() -> Any:
            return self.lock_locker.try_acquire(
                name,
                options.ttl,
                owner=Owner(task_id=task_id, host=request.hostname or _HOSTNAME, pid=os.getpid()),
                fencing=options.fencing,
                max_lifetime=self._hard_time_limit(request, options),
                on_lost=self._on_lock_lost,
                unless_finished=unless_finished,
            )

        try:
            try:
                outcome = acquire()
            except LockBackendUnavailable as exc:
                outcome = self._on_backend_unavailable(exc, name, options, request)
                if outcome is None:
                    return
            is_copy = policies.is_marked_copy(request)
            if not isinstance(outcome, Lease):
                duplicate = policies.Duplicate(self, request, options, name, outcome)
                is_copy = is_copy or duplicate.is_copy
                outcome = policies.handle(duplicate, acquire)
        except AlreadyFinished:
            self._drop_copy(task_id, "its finish is recorded under the lock")
        if policies.already_ran(self, request, is_copy):
            outcome.release()
            self._drop_copy(task_id, "its outcome is stored")
        handle = LockHandle(outcome.key, outcome)
        request.lock = handle
        _held_here.by_name[name] = handle
        if self.lock_track_started:
            self._store_started(task_id, request)
        if lock_acquired.receivers:
            lock_acquired.send(sender=self, task_id=task_id, key=outcome.key, fence=outcome.fence)

    def _store_started(self, task_id: str, request: Any) -> None:
        """STARTED, as Celery's tracer stores it with ``track_started`` (see
        ``lock_track_started``); a backend failure costs the state, not the run."""
        if policies.ignores_result(self, request):
            return
        meta = {"pid": os.getpid(), "hostname": request.hostname or _HOSTNAME}
        try:
            self.backend.store_result(task_id, meta, states.STARTED, request=request)
        except policies.BACKEND_ERRORS as exc:
            log.warning("task %s[%s]: cannot store STARTED (%s)", self.name, task_id, exc)

    def _drop_copy(self, task_id: str, why: str) -> NoReturn:
        # Usually a broker redelivery; also a message sent again on purpose under the same id
        # (see lock_finished_ttl), hence the wording.
        log.warning(
            "task %s[%s]: not run: this task id already ran to the end (%s)",
            self.name,
            task_id,
            why,
        )
        raise Ignore(f"task id already ran to the end ({why})")

    def _hard_time_limit(self, request: Any, options: LockOptions) -> Optional[float]:
        limits = request.timelimit
        hard = limits[0] if limits and limits[0] else options.default_time_limit
        return float(hard) if hard else None

    def _on_backend_unavailable(
        self, exc: LockBackendUnavailable, name: str, options: LockOptions, request: Any
    ) -> Optional[Lease]:
        if request.is_eager and options.on_backend_error == "retry":
            # apply() callers get the error now rather than a retry loop
            raise LockBackendUnavailable(
                f"task {self.name}[{request.id}]: {exc.message}", exc.key
            ) from exc
        if options.on_backend_error == "run":
            log.error("task %s[%s]: %s; running WITHOUT the lock", self.name, request.id, exc)
            request.lock = LockHandle(exc.key, None, locked=False)
            if self.lock_track_started:
                self._store_started(request.id, request)
            return None
        log.error("task %s[%s]: %s; retrying later", self.name, request.id, exc)
        unknown = LockHolder(
            key=exc.key or name,
            task_id="",
            host="",
            pid=None,
            acquired_at=None,
            fence=None,
            ttl=None,
        )
        policies.retry(policies.Duplicate(self, request, options, name, unknown), exc)

    def _on_lock_lost(self, lease: Lease) -> None:
        # Runs in the renewer thread: the body learns of it through request.lock.lost/check().
        log.error(
            "task %s[%s]: lock %s LOST while running (expired or taken over); the body should "
            "stop before its next write (self.request.lock.check())",
            self.name,
            lease.owner.task_id,
            lease.key,
        )
        if lock_lost.receivers:
            lock_lost.send(sender=self, task_id=lease.owner.task_id, key=lease.key)

    # -- release -----------------------------------------------------------------------------

    def release_lock(
        self, request: Any = None, *, wait: bool = True, finished: bool = False
    ) -> None:
        """Release the lock of ``request`` (default: the current one) if this run owns it.

        Called after the body on every exit path; safe to call more than once. With
        ``wait=False`` the release is sent without waiting for its reply (Redis frees the lock
        as it arrives; the outcome is logged and signalled once the reply is read); renewal
        stops at once either way. ``finished``: the body ran to an outcome; for an
        ``acks_late`` task the release then records its task id for ``lock_finished_ttl``,
        so that a redelivered copy of it takes nothing (see ``before_start``).
        """
        request = self.request if request is None else request
        handle: Optional[LockHandle] = getattr(request, "lock", None)
        if handle is None or handle.lease is None or handle.lease.released:
            return
        lease = handle.lease
        for name, held in list(_held_here.by_name.items()):
            if held is handle:
                del _held_here.by_name[name]
        task_id = request.id

        def released(owned: Optional[bool]) -> None:
            if owned is None:
                log_release.error(
                    "task %s[%s]: could not release %s; it frees itself within %.1fs",
                    self.name,
                    task_id,
                    lease.key,
                    lease.ttl,
                )
                return
            if not owned:
                log_release.warning(
                    "task %s[%s]: lock %s had expired or been taken over before its release",
                    self.name,
                    task_id,
                    lease.key,
                )
            if lock_released.receivers:
                lock_released.send(sender=self, task_id=task_id, key=lease.key, owned=owned)

        remember_for = self.lock_options.finished_ttl if finished and self.acks_late else None
        if not wait:
            lease.locker.release_soon(lease, released, remember_for=remember_for)
            return
        try:
            owned: Optional[bool] = lease.release(remember_for=remember_for)
        except LockBackendUnavailable:
            owned = None
        released(owned)

    @staticmethod
    def _successors_follow(request: Any) -> bool:
        """The request has successors Celery publishes after the body: release before them."""
        return bool(
            request.is_eager
            or request.callbacks
            or request.chain
            or request.chord
            or request.errbacks
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return super().__call__(*args, **kwargs)

    # The worker calls __call__ (not ``run``) because it is overridden. Releasing as the body
    # ends stops renewal at once and frees the lock before Celery publishes callbacks and chain
    # steps (a same-key chain step cannot collide with it), on every exit path of the body.
    __call__ = _releasing_lock(__call__)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own_call = cls.__dict__.get("__call__")
        if own_call is not None and not getattr(own_call, "releases_lock", False):
            # A subclass's own __call__ releases too, whether or not it calls super().
            cls.__call__ = _releasing_lock(own_call)  # type: ignore[method-assign]

    if tuple(CELERY_VERSION[:2]) < (5, 5):
        push_request = _push_request_copying_the_current

    def retry(self, *args: Any, throw: bool = True, **kwargs: Any) -> Any:
        """Celery's ``retry``; releases the lock first so the new attempt cannot collide with it."""
        if throw and not self.request.called_directly:
            self.release_lock()
        return super().retry(*args, throw=throw, **kwargs)
