"""``LockedTask``: a Celery task base that runs at most one execution per lock key at a time."""

from __future__ import annotations

import inspect
import logging
import os
import socket
import threading
from functools import partial
from typing import Any, Callable, NoReturn, Optional, Sequence

from celery import Task
from celery.exceptions import Ignore

from celery_singleton_lock.celery import celery_api
from celery_singleton_lock.celery.config.limits import limit_for
from celery_singleton_lock.celery.config.lockers import locker_for
from celery_singleton_lock.celery.config.options import TASK_ONLY_OPTIONS, TASK_OPTIONS, UNSET
from celery_singleton_lock.celery.config.resolution import LockOptions, check_option_names, resolve
from celery_singleton_lock.celery.duplicates import enqueue, latest
from celery_singleton_lock.celery.duplicates.actions import Duplicate
from celery_singleton_lock.celery.duplicates.backend_outage import on_backend_unavailable
from celery_singleton_lock.celery.duplicates.policies import on_held
from celery_singleton_lock.celery.duplicates.redelivery import already_ran, is_marked_copy
from celery_singleton_lock.celery.observe import events
from celery_singleton_lock.celery.signals import lock_acquired, lock_lost
from celery_singleton_lock.celery.task import execution
from celery_singleton_lock.celery.task.execution import (
    LockScope,
    body_releasing,
    closes_scope_on_error,
    open_scope,
    releases_after_body,
)
from celery_singleton_lock.celery.task.replica_pause import PAUSE
from celery_singleton_lock.engine import (
    AcquireRequest,
    Lease,
    LockBackend,
    LockHolder,
    Owner,
    Parked,
)
from celery_singleton_lock.errors import (
    AlreadyFinished,
    AlreadySuperseded,
    DuplicateTaskError,
    LockBackendUnavailable,
    LockConfigurationError,
    LockError,
)

log = logging.getLogger("celery_singleton_lock.acquire")

_HOSTNAME = socket.gethostname()


def lock_owner(task_id: str, request: Any, pid: Optional[int] = None) -> Owner:
    """The owner a lock of this execution names: task id, worker node (else this host) and
    the pid running the body (None: this process's, as the engine keeps it). The main
    process's renewal and its reclaim of a dead child's lock match it byte for byte, so it is
    built here only."""
    host = request.hostname or _HOSTNAME
    if pid is None:
        return Owner(task_id=task_id, host=host)
    return Owner(task_id=task_id, host=host, pid=pid)


celery_api.declare_request_attribute("lock")  # self.request.lock: see there why
_ATTRIBUTES = (*TASK_OPTIONS, *TASK_ONLY_OPTIONS, "ignore_result")
_TASK_RUN = Task.__dict__["run"]  # Celery's own: raises NotImplementedError


class LockedTask(Task):  # type: ignore[misc]
    """Task base class: the worker takes a per-argument Redis lock before the body runs.

    The lock is taken in ``before_start`` (so beat, ``send_task``, retries and redelivery are
    all covered), renewed by a worker-side thread while the body runs, and released after it
    on every exit path. The body sees its lock as ``self.request.lock`` (a
    :class:`~celery_singleton_lock.celery.task.lock_view.LockHandle`).

    Every ``lock_*`` attribute left unset takes the app setting ``singleton_lock_<name>``
    (e.g. ``singleton_lock_ttl``), else the default shown. A direct call ``task(...)`` runs
    the body in the caller without any lock (Celery does not run ``before_start`` there).
    """

    #: The worker-side request class (Celery's ``Task.Request``): Celery's own, which also
    #: keeps the content type of the message, so that a call the lock layer sends again (a
    #: lock retry, a parked call handed on) keeps the serializer it was sent with. A task
    #: that sets its own ``Request`` subclasses
    #: :class:`~celery_singleton_lock.celery.task.worker_request.LockedRequest`.
    Request = "celery_singleton_lock.celery.task.worker_request:LockedRequest"

    # The lock options. Each is declared once, with its app setting, default, allowed values
    # and meaning, in celery/config/options.py (TASK_OPTIONS, TASK_ONLY_OPTIONS); the options
    # reference of the docs is generated from there. Unset, an option takes the app setting
    # ``singleton_lock_<name>``, else its default; every value is checked at registration.
    lock_ttl: Any = UNSET
    on_duplicate: Any = UNSET
    lock_on: Optional[Sequence[str]] = None
    lock_key: Optional[Callable[..., str]] = None
    lock_fair_by: Optional[Sequence[str]] = None
    lock_group: Optional[str] = None
    lock_fencing: Any = UNSET
    lock_retry_backoff: Any = UNSET
    lock_retry_backoff_max: Any = UNSET
    lock_max_retries: Any = UNSET
    lock_wait_timeout: Any = UNSET
    lock_on_backend_error: Any = UNSET
    lock_finished_ttl: Any = UNSET
    lock_min_replicas: Any = UNSET
    lock_min_replicas_timeout: Any = UNSET
    lock_limit: Any = UNSET
    lock_cooldown: Any = UNSET
    lock_cooldown_after: Any = UNSET
    lock_rate: Any = UNSET

    #: Celery's ``track_started`` (task attribute or ``task_track_started``), taken over by
    #: the lock: STARTED is stored once the lock is held, not before ``before_start`` as the
    #: tracer does, so a duplicate that is skipped or retried never shows STARTED, and a
    #: redelivered copy of a finished execution cannot overwrite its outcome with STARTED
    #: (the tracer stores it by reading, then writing the state).
    lock_track_started: bool = False

    dedupe_on_enqueue: Any = UNSET
    lock_queued_ttl: Any = UNSET
    lock_debounce: Any = UNSET
    lock_cancel_grace: Any = UNSET
    lock_debounce_max: Any = UNSET

    _lock_options: Optional[LockOptions] = None
    #: (options, the acquire request a worker's call starts from): see execution.request_base
    _acquire_base: Optional[tuple[LockOptions, AcquireRequest]] = None
    #: the locker of a worker's call and the task's prepared acquire: see execution.prepared
    _prepared_acquire: Optional[execution.PreparedCalls] = None
    #: ``lock_locker`` is this class's own: the app's locker (see execution.prepared)
    _app_locker = True

    if not celery_api.PUSH_REQUEST_COPIES:  # Celery < 5.5: see there
        push_request = celery_api.push_request_copying_the_current

    # -- configuration -----------------------------------------------------------------------

    @classmethod
    def on_bound(cls, app: Any) -> None:
        super().on_bound(app)
        if not issubclass(DuplicateTaskError, tuple(cls.throws)):
            # an expected outcome: logged without a traceback
            cls.throws = (*tuple(cls.throws), DuplicateTaskError)
        if cls.track_started:  # resolved from the settings by bind(); see lock_track_started
            cls.lock_track_started, cls.track_started = True, False
        if cls.name:
            cls._lock_options = cls._resolve_options(app, cls.name)
            return
        # ``app.register_task(Task())`` names the instance, not its class, before binding
        for task in celery_api.registered_instances(app, cls):
            task.resolve_lock_options()

    @classmethod
    def _resolve_options(cls, app: Any, name: str) -> LockOptions:
        check_option_names(name, cls)
        run = inspect.getattr_static(cls, "run")
        run = getattr(run, "lock_body", run)  # the task's own, not body_releasing's wrapper
        func = run.__func__ if isinstance(run, staticmethod) else run
        return resolve(
            task_name=name,
            func=func,
            skip_first=not isinstance(run, staticmethod),
            attributes={attribute: getattr(cls, attribute) for attribute in _ATTRIBUTES},
            conf=app.conf,
            time_limit=cls.time_limit,
        )

    def resolve_lock_options(self) -> LockOptions:
        """Validate this task's lock options under its registered name, and keep them (at
        registration, and again at worker start for settings changed since).

        Raises:
            LockConfigurationError: naming the task and the bad option.
        """
        if not self.name:
            raise LockConfigurationError(
                f"task class {type(self).__qualname__} has no name: register it with "
                "app.register_task() or @app.task, or give it a name attribute"
            )
        self._lock_options = options = type(self)._resolve_options(self.app, self.name)
        return options

    @property
    def lock_options(self) -> LockOptions:
        """This task's resolved lock options."""
        return self._lock_options or self.resolve_lock_options()

    @property
    def lock_locker(self) -> LockBackend:
        """The engine locker this task's app uses."""
        return locker_for(self.app)

    # -- enqueue -----------------------------------------------------------------------------

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: Optional[str] = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: Any = None,
        **options: Any,
    ) -> Any:
        """Celery's ``apply_async``; with ``dedupe_on_enqueue``, a call whose lock name is
        already queued or running publishes nothing and returns that task's ``AsyncResult``
        (one round trip to the lock server first; see
        :mod:`~celery_singleton_lock.celery.duplicates.enqueue`)."""

        def publish(chosen_id: Optional[str]) -> Any:
            return super(LockedTask, self).apply_async(
                args, kwargs, chosen_id, producer, link, link_error, shadow, **options
            )

        self.lock_options.policy.sending(options)  # replace stamps when the call is sent
        dedupe = self.enqueue_dedupe(options)
        if dedupe is None:
            return publish(task_id)
        if not dedupe.canvas and (link or link_error or enqueue.in_canvas(options)):
            return publish(task_id)
        return enqueue.publish_once(self, args, kwargs, task_id, options, publish, dedupe)

    def enqueue_dedupe(self, options: dict[str, Any]) -> Optional[enqueue.Dedupe]:
        """How ``apply_async`` with ``options`` deduplicates at enqueue; None: it does not.

        A subclass may read (and pop) options of its own here, as ``compat.QueueOnce`` does
        with celery-once's ``once``.
        """
        lock_options = self.lock_options
        if not lock_options.dedupe_on_enqueue or self.app.conf.task_always_eager:
            return None
        return enqueue.Dedupe(
            queued_ttl=lock_options.queued_ttl,
            running_is_duplicate=not lock_options.dedupe_until_started,
        )

    # -- the worker's tracer -------------------------------------------------------------------

    @property
    def __trace__(self) -> Any:
        return self._lock_tracer

    @__trace__.setter
    def __trace__(self, tracer: Any) -> None:
        # The tracer the worker builds for this task, made to end an execution that must not
        # run (Ignore) without Celery's traceback work (celery_api.quiet_ends).
        self._lock_tracer = celery_api.quiet_ends(tracer)

    _lock_tracer: Any = None

    # -- acquire: the hot path ---------------------------------------------------------------

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        options = self._lock_options or self.resolve_lock_options()
        request = self.request
        name = options.keyer.name(args, kwargs)
        outer = open_scope(name)
        if outer is not None:
            request.lock = outer.nested()
            return
        acquired: Optional[tuple[Lease, bool, int]]
        try:
            if options.prepared and task_id and not request.is_eager:
                # A worker's call of a plain lock (or a static limit), the hot path: through
                # the task's prepared acquire.
                # Any other outcome goes on in _acquire, as the general way's would.
                owner = lock_owner(task_id, request)
                max_lifetime = celery_api.hard_time_limit(request) or options.default_time_limit
                try:
                    # the first call in a process makes the locker: the server is asked then
                    plan = execution.prepared(self, options)
                    first: Any = plan.acquire.acquire(name, owner, max_lifetime)
                except (LockBackendUnavailable, AlreadyFinished, AlreadySuperseded) as exc:
                    first = exc  # handled in _acquire, as the general way's
                if type(first) is Lease:
                    acquired = first, is_marked_copy(request), options.limit
                else:
                    acquired = self._acquire(task_id, name, options, request, first)
            else:
                acquired = self._acquire(task_id, name, options, request)
        except Ignore as end:
            # A skip, a parked call, a lock retry: Celery's own handling of an Ignore costs
            # more than a no-op run (see celery_api.EndedQuietly); in a worker's tracer, end
            # without it. Elsewhere, raised again from here it carries this frame and the
            # tracer's only, not the five between, whose traceback the tracer would format.
            if celery_api.can_end_quietly():
                raise celery_api.EndedQuietly(end) from None
            raise end.with_traceback(None) from None
        if acquired is None:
            return  # running without the lock (lock_on_backend_error="run")
        lease, is_copy, limit = acquired
        if PAUSE.active:
            PAUSE.resumed()
        # From here the scope owns the lock: whatever raises below closes it (as
        # closes_scope_on_error does for a subclass's own before_start, written out here to
        # save every task the wrapper's call).
        request.lock = held = LockScope(self, task_id, name, lease, limit, eager=request.is_eager)
        try:
            if (is_copy or self.acks_late) and already_ran(self, request, is_copy):
                held.close()
                self._drop_copy(task_id, "its outcome is stored")
            after_acquire = options.policy.acquired
            if after_acquire is not None:
                after_acquire(self, request)  # e.g. a join's retry whose holder ended meanwhile
            if self.lock_track_started:
                self._store_started(task_id, request)
            if lock_acquired.receivers:
                lock_acquired.send(sender=self, task_id=task_id, key=lease.key, fence=lease.fence)
        except BaseException:
            held.close()
            raise

    before_start.closes_scope = True  # type: ignore[attr-defined]

    def _acquire(
        self, task_id: str, name: str, options: LockOptions, request: Any, first: Any = None
    ) -> Optional[tuple[Lease, bool, int]]:
        """Take the lock, applying the duplicate policy if it is held: the lease, whether
        this message is a copy of an earlier delivery and the call's lock_limit; None to run
        without the lock. Ends the execution (``Ignore``, retry, or an error) when the body
        must not run. ``first``: what a worker's call's prepared acquire gave instead
        of a lease (the holder, or the error), from ``before_start``: not acquired again."""
        worker_call = bool(task_id) and not request.is_eager
        owner = lock_owner(task_id, request)
        max_lifetime = celery_api.hard_time_limit(request) or options.default_time_limit
        # A parking policy (queue, replace): the acquire parks the message when the lock is
        # held. A limit above 1: each call takes a slot (a callable caps each call).
        policy = options.policy
        wanted = execution.request_base(self, options, bool(task_id), request.is_eager)
        wanted = wanted.for_call(name, owner, max_lifetime)
        if worker_call and policy.parks:
            wanted = policy.park(self, request, options, wanted)
        if type(options.limit) is not int:  # a static limit is in the request already
            keyer = options.keyer
            limit = limit_for(self.name, options.limit, keyer, request.args, request.kwargs)
            wanted = wanted._replace(limit=limit)

        try:
            try:
                if isinstance(first, LockError):
                    raise first
                # the first call in a process makes the locker: the server is first asked then;
                # a worker's call goes through the one chosen for the task's calls, kept
                locker = (
                    execution.prepared(self, options).locker if worker_call else self.lock_locker
                )
                outcome: Any = locker.acquire(wanted) if first is None else first
            except LockBackendUnavailable as exc:
                on_backend_unavailable(self, exc, name, options, request)
                return None  # it returns only to run without the lock
            is_copy = is_marked_copy(request)
            if isinstance(outcome, Parked):
                holder = outcome.holder or LockHolder.unknown(outcome.key)
                policy.parked(Duplicate(self, request, options, name, holder), outcome, wanted)
            if not isinstance(outcome, Lease):
                duplicate = Duplicate(self, request, options, name, outcome)
                if outcome.paused:
                    duplicate.reason = "paused"
                elif outcome.over_rate:
                    duplicate.reason = "rate"
                elif outcome.cooling:
                    duplicate.reason = "cooldown"
                elif wanted.limit != 1:
                    duplicate.reason = "limit"
                is_copy = is_copy or duplicate.is_copy
                # A duplicate policy acquires again (a wait, a join): never parked then.
                again = wanted if wanted.park is None else wanted._replace(park=None, latest=None)
                acquire = partial(locker.acquire, again)  # without park: never Parked
                outcome = on_held(duplicate, acquire)  # type: ignore[arg-type]
        except AlreadyFinished:
            self._drop_copy(task_id, "its finish is recorded under the lock")
        except AlreadySuperseded as exc:
            latest.end_stale_copy(self, request, name, exc.key or name)
        return outcome, is_copy, wanted.limit

    def _store_started(self, task_id: str, request: Any) -> None:
        """STARTED, as Celery's tracer stores it with ``track_started`` (see
        ``lock_track_started``); a failure to store it costs the state, not the run."""
        if celery_api.ignores_result(self, request):
            return
        meta = {"pid": os.getpid(), "hostname": request.hostname or _HOSTNAME}
        try:
            celery_api.store_started(self, task_id, request, meta)
        except celery_api.STORE_ERRORS as exc:
            log.warning("task %s[%s]: cannot store STARTED (%r)", self.name, task_id, exc)

    def _drop_copy(self, task_id: str, why: str) -> NoReturn:
        # Usually a broker redelivery; also a message sent again on purpose under the same id
        # (see lock_finished_ttl), hence the wording.
        log.warning(
            "task %s[%s]: not run: this task id already ran to the end (%s)",
            self.name,
            task_id,
            why,
        )
        celery_api.logged_already(task_id)
        raise Ignore(f"task id already ran to the end ({why})")

    def _on_lock_lost(self, lease: Lease) -> None:
        # Runs in the renewer thread: the body learns of it through request.lock.lost/check().
        log.error(
            "task %s[%s]: lock %s LOST while running (expired or taken over); the body should "
            "stop before its next write (self.request.lock.check())",
            self.name,
            lease.owner.task_id,
            lease.key,
        )
        # not from this thread: a slow broker must never delay the renewal of other leases
        threading.Thread(
            target=events.send_event,
            args=(self, events.LOST),
            kwargs={"task_id": lease.owner.task_id, "hostname": lease.owner.host, "key": lease.key},
            name="celery-singleton-lock-event",
            daemon=True,
        ).start()
        if lock_lost.receivers:
            lock_lost.send(sender=self, task_id=lease.owner.task_id, key=lease.key)

    # -- release -----------------------------------------------------------------------------

    def release_lock(self, request: Any = None, *, finished: bool = False) -> None:
        """Release the lock of ``request`` (default: the current one) if this run owns it.

        Called after the body on every exit path; safe to call more than once; never raises
        (a release problem is logged and signalled). ``finished``: the body ran to an
        outcome; for an ``acks_late`` task the release then records its task id for
        ``lock_finished_ttl``, so that a redelivered copy of it takes nothing (see
        ``before_start``).
        """
        held = getattr(self.request if request is None else request, "lock", None)
        if isinstance(held, LockScope):
            held.close(finished=finished)

    # The body's end releases: ``run`` is wrapped (body_releasing), so that the scope closes
    # as the body ends, on every exit path, before Celery publishes callbacks and chain steps
    # (a same-key chain step cannot collide with it); releasing stops renewal at once. Not
    # ``__call__``: overriding it makes the tracer go through Celery's ``Task.__call__`` and
    # its request copy for every task.

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The body releases wherever ``run`` comes from (this class, a mixin, a base).
        run = inspect.getattr_static(cls, "run")
        if run is not _TASK_RUN and not getattr(run, "releases_lock", False):
            cls.run = body_releasing(run)
        # Any __call__ but Celery's releases too, wherever it comes from (this class, or a
        # base placed before LockedTask, such as a cache that may answer without calling
        # run), whether or not it calls super() (its run, called inside, then owns nothing).
        # The tracer calls this resolved __call__ (Celery's task_has_custom), so the scope is
        # closed however __call__ is composed. A subclass's own before_start that raises after
        # super().before_start releases too.
        call = inspect.getattr_static(cls, "__call__")
        celerys = str(getattr(call, "__module__", "")).startswith(
            "celery."
        )  # or its worker's patch
        if not celerys and not getattr(call, "releases_lock", False):
            cls.__call__ = releases_after_body(call)
        cls._app_locker = inspect.getattr_static(cls, "lock_locker") is _APP_LOCKER
        own_before_start = cls.__dict__.get("before_start")
        if own_before_start is not None and not getattr(own_before_start, "closes_scope", False):
            cls.before_start = closes_scope_on_error(own_before_start)  # type: ignore[method-assign]

    def retry(self, *args: Any, throw: bool = True, **kwargs: Any) -> Any:
        """Celery's ``retry``; releases the lock first so the new attempt cannot collide with it."""
        if throw and not self.request.called_directly:
            self.release_lock()
        return super().retry(*args, throw=throw, **kwargs)


_APP_LOCKER = LockedTask.__dict__["lock_locker"]
