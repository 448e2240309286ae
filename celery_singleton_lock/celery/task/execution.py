"""The one lock scope of an execution: from the acquire in ``before_start`` to the release.

After a successful acquire, a :class:`LockScope` owns the lock until it is closed, and every
path closes it: the body's outcome (its ``run``, see :func:`body_releasing`),
``self.retry()``, and any exception raised after the acquire, by ``before_start`` itself or by
a subclass's ``before_start`` around it. Closing stops renewal, releases the lock, and takes
the scope out of its thread's registry. In a worker on one server (or Sentinel) the release is
sent without waiting: its reply is read with the next command on that connection (the next
task's acquire), or by the renewer when none followed (an idle worker: within 50 ms), and
reported then (``lock_released``, the "expired before its release" warning); an eager call
waits for it. The time a receiver of ``lock_released`` measures to (the metrics' held time) is
when the release was sent, not when its reply was read (:func:`release_sent_at`). It never
raises: a release problem is logged and signalled, and the body's outcome stands.

The registry of a thread maps lock names to the scopes open in it. A run that finds its own
lock name there is nested inside a run of the same thread (e.g. ``.apply()`` from a body) and
shares that run's lock (:meth:`LockHandle.nested`): it owns nothing and releases nothing.

The scope is also the body's view of its lock: ``self.request.lock`` is the scope itself.

The acquire that opens a scope is planned here too: what every call of the task asks (made
once per resolved options, :func:`request_base`), then the call's own name, owner and time
limit. A worker's call that asks nothing more (no parking, a static ``lock_limit``:
``LockOptions.prepared``) goes through the locker's prepared acquire (:func:`prepared`,
``LockBackend.prepare``: checked once, and packed for a plain mutex); the others add their own
fields to the request (``AcquireRequest.for_call``), in ``LockedTask._acquire``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import threading
import time
from typing import Any, Callable, NamedTuple, Optional, TypeVar

from celery.exceptions import Ignore, Reject, Retry
from redis.exceptions import RedisError

from celery_singleton_lock.celery import celery_api
from celery_singleton_lock.celery.config import lockers
from celery_singleton_lock.celery.config.lockers import locker_for
from celery_singleton_lock.celery.config.resolution import LockOptions
from celery_singleton_lock.celery.observe import events
from celery_singleton_lock.celery.signals import lock_released
from celery_singleton_lock.celery.task.lock_view import LockHandle
from celery_singleton_lock.engine import (
    AcquireRequest,
    CancelSignal,
    Lease,
    LockBackend,
    PausingRules,
    PreparedAcquire,
    PushedCancelFlags,
    required,
)
from celery_singleton_lock.errors import LockConfigurationError, LockError

log = logging.getLogger("celery_singleton_lock.release")

F = TypeVar("F", bound=Callable[..., Any])

#: Seconds between two reads of a restartable call's cancel flag (``lock.cancelled``) by the
#: body itself: the fallback. The news is pushed (the process listens on the lock's cancel
#: channel from the body's first look, see engine/cancel_watch.py); a read now and then covers
#: a message lost while that connection was down, or a process that could not subscribe.
CANCEL_POLL = 2.0
#: Seconds between two reads of the flag while the news is not pushed: on a backend that
#: cannot push it (PostgreSQL), or until the server confirmed the subscription (never, with a
#: client that cannot subscribe): the read is then the only way the body learns it.
CANCEL_READ_UNPUSHED = 0.05


class _OpenScopes(threading.local):
    def __init__(self) -> None:
        self.by_name: dict[str, LockScope] = {}


_open = _OpenScopes()


class _Reporting(threading.local):
    #: ``time.monotonic()`` when the release ``lock_released`` is being sent for was sent
    sent_at: Optional[float] = None


_reporting = _Reporting()


def release_sent_at() -> float:
    """For a receiver of ``lock_released``: when the release it hears of was sent
    (``time.monotonic()``); its reply, and so the signal, may come later (read with the next
    task's acquire, or by the renewer). Now, outside such a receiver."""
    sent_at = _reporting.sent_at
    return time.monotonic() if sent_at is None else sent_at


def open_scope(name: str) -> Optional[LockScope]:
    """The scope open in this thread for lock ``name``, if any: one whose request is still
    running in this thread (a run this one is nested in). A scope left open by a request
    that has ended is never taken for an outer scope: it is closed here (its lock released,
    its renewal stopped), and the new run takes a lock of its own."""
    scope = _open.by_name.get(name)
    if scope is None or scope.running():  # the rare nested run pays for the check, no other
        return scope
    log.error(
        "task %s[%s]: its lock %s was still open after its run ended; released now",
        scope.task.name,
        scope.task_id,
        scope.key,
    )
    scope.close()
    return None


class LockScope(LockHandle):
    """One execution's hold on its lock; see the module docstring.

    Opening it registers it in the current thread; :meth:`close` ends it, once.
    """

    __slots__ = (
        "_body_started",
        "_cancel_read_at",
        "_cancel_signal",
        "_cancelled",
        "_closed",
        "_sent_at",
        "eager",
        "limit",
        "name",
        "task",
        "task_id",
    )

    def __init__(
        self,
        task: Any,
        task_id: str,
        name: str,
        lease: Lease,
        limit: int = 1,
        *,
        eager: bool = False,
    ) -> None:
        # LockHandle's fields, set here: one call less on every task's hot path
        self.key = lease.key
        self._lease = lease
        self.reentrant = False
        self.locked = True
        self.task = task
        self.task_id = task_id
        self.name = name
        #: the call's lock_limit (a callable's value for this call)
        self.limit = limit
        #: run by ``apply()`` (or a direct call): its release is waited for
        self.eager = eager
        self._body_started = False
        self._closed = False
        self._cancelled = False
        self._cancel_read_at = -math.inf  # the first look reads, however young the clock
        self._cancel_signal: Optional[CancelSignal] = None
        _open.by_name[name] = self

    @property
    def lease(self) -> Lease:
        """The engine lease this execution owns."""
        lease = self._lease
        assert lease is not None  # a scope is only ever opened with its lease
        return lease

    @property
    def cancelled(self) -> bool:
        """True once a newer call asked this one to stop (policy ``restart``), and True for
        good once seen. The first look reads the flag and has this process listen on the
        lock's cancel channel: from then on the news is pushed (a look costs no round trip),
        and the flag is read again only every :data:`CANCEL_POLL` seconds, as a fallback."""
        if self._cancelled:
            return True
        signal = self._cancel_signal
        if signal is not None and signal.asked:
            self._cancelled = True
            return True
        now = time.monotonic()
        pushed = signal is not None and signal.subscribed  # else the reads are the news
        if now - self._cancel_read_at < (CANCEL_POLL if pushed else CANCEL_READ_UNPUSHED):
            return False
        task = self.task
        if not (task._lock_options or task.resolve_lock_options()).policy.restarts:
            return False
        self._cancel_read_at = now
        cancels = task.lock_locker.cancels
        if cancels is None:  # no latest wins on this backend: registration refused restart
            return False
        try:
            if signal is None and not self._closed and isinstance(cancels, PushedCancelFlags):
                # listened to from now; a stop asked before the subscription took effect is
                # found by the read below, or by the read that follows its confirmation
                signal = self._cancel_signal = cancels.watch(self.name, self.task_id)
            asked = cancels.cancel_requested([(self.name, self.task_id)])
        except LockError as exc:  # not told: the worker's grace still ends it (prefork)
            log.warning(
                "task %s[%s]: cannot read its cancel flag (%s)", task.name, self.task_id, exc
            )
            return False
        self._cancelled = bool(asked and asked[0]) or (signal is not None and signal.asked)
        return self._cancelled

    def raise_if_cancelled(self) -> None:
        """End the call as superseded if a newer call asked it to stop (see
        :attr:`cancelled`); its release hands the lock to that call."""
        if self.cancelled:
            task = self.task
            policy = (task._lock_options or task.resolve_lock_options()).policy
            policy.stop_cancelled(task, celery_api.current_request(task), self.key)

    def pause_for(self, seconds: float) -> float:
        """See :meth:`LockHandle.pause_for`: the live rule of the lock's family (the task's or
        group's name, the lock name before its argument digest), lengthened only."""
        locker = self.task.lock_locker
        rules = getattr(locker, "live_rules", None)
        if not isinstance(rules, PausingRules):
            raise LockConfigurationError(
                f"task {self.task.name}: pause_for needs one Redis server, Sentinel or a Redis "
                "Cluster (the pause is one key per task or group, read by every acquire in the "
                f"same script call); this task's locks are on {locker.capabilities.kind}, which "
                "keeps no pause"
            )
        return float(rules.pause(self.name.rpartition(":")[0], seconds, lengthen=True))

    def running(self) -> bool:
        """Whether the request this scope was opened for is still on its task's request
        stack in this thread."""
        return any(
            getattr(request, "lock", None) is self for request in self.task.request_stack.stack
        )

    def close(self, *, finished: bool = False, succeeded: bool = False) -> None:
        """Stop renewal and release the lock; later calls do nothing. Never raises.

        Args:
            finished: the body ran to an outcome. For an ``acks_late`` task the release then
                records the task id for ``lock_finished_ttl`` (see ``LockedTask``).
            succeeded: the body returned. With ``lock_cooldown`` the key then stays taken for
                the cooldown (after any outcome with ``lock_cooldown_after="always"``).
        """
        if self._closed:
            return
        self._closed = True
        if _open.by_name.get(self.name) is self:
            del _open.by_name[self.name]
        if self._cancel_signal is not None:  # a restartable body that looked: listened to
            self._stop_listening(self._cancel_signal)
        task = self.task
        options = task._lock_options or task.resolve_lock_options()
        policy = options.policy
        # a parking task's finish is always recorded: a hand-off sent twice must not run twice
        remember = finished and (task.acks_late or policy.parks)
        remember_for = options.finished_ttl if remember else None
        lease = self._lease
        assert lease is not None  # a scope is only ever opened with its lease
        # the cooldown this release leaves (after a success, or any outcome with "always")
        cooldown = (
            options.cooldown
            if succeeded or (finished and options.cooldown_after == "always")
            else None
        )
        if lock_released.receivers:  # timed when sent: the reply may be read much later
            self._sent_at = time.monotonic()
        try:
            if policy.parks:  # the lock is handed on to a parked call
                owned = policy.release(self, options, cooldown, remember_for)
            elif cooldown:
                backend: Any = lease.locker  # the backend that granted it
                cooling = required(backend.cooldown, backend, "lock_cooldown", "cooldown")
                owned = cooling.release_cooling(lease, cooldown, remember_for=remember_for)
            elif not self.eager and lease.locker.release_later(
                lease, self._settled, remember_for=remember_for
            ):
                return  # reported once the reply is read (the next command on the connection)
            else:
                owned = lease.release(remember_for=remember_for)
        except (LockError, RedisError) as exc:
            self._not_released(exc)
            return
        self._released(owned)

    def _stop_listening(self, signal: CancelSignal) -> None:
        self._cancel_signal = None
        cancels = self.task.lock_locker.cancels
        if isinstance(cancels, PushedCancelFlags):
            cancels.unwatch(signal)

    def _settled(self, owned: Optional[bool], error: Optional[LockError]) -> None:
        """The reply of a release sent without waiting, read later: reported as if waited."""
        if error is not None:
            self._not_released(error)
        elif not owned or lock_released.receivers:
            self._released(bool(owned))
        # else: released as it should be, and no receiver to tell

    def _not_released(self, exc: BaseException) -> None:
        log.error(
            "task %s[%s]: could not release %s (%s); it frees itself within %.1fs",
            self.task.name,
            self.task_id,
            self.key,
            exc,
            self.lease.ttl,
        )

    def _released(self, owned: bool) -> None:
        """Log and signal the outcome of the release Redis answered."""
        task, lease = self.task, self.lease
        if not owned:
            log.warning(
                "task %s[%s]: lock %s had expired or been taken over before its release",
                task.name,
                self.task_id,
                self.key,
            )
            events.send_event(
                task,
                events.RELEASED_LATE,
                task_id=self.task_id,
                hostname=lease.owner.host,
                key=self.key,
            )
        if lock_released.receivers:
            reporting, _reporting.sent_at = _reporting.sent_at, getattr(self, "_sent_at", None)
            try:
                lock_released.send(sender=task, task_id=self.task_id, key=self.key, owned=owned)
            finally:
                _reporting.sent_at = reporting


def closes_scope_on_error(before_start: F) -> F:
    """Wrap a ``before_start`` so that an exception raised after the lock was taken (by the
    rest of it, or by a subclass's code around ``super().before_start``) closes the scope."""

    @functools.wraps(before_start)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return before_start(self, *args, **kwargs)
        except BaseException:
            held = getattr(self.request, "lock", None)
            if isinstance(held, LockScope):
                held.close()
            raise

    wrapper.closes_scope = True  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def releases_after_body(call: F, *, takes_self: bool = True) -> F:
    """Wrap a task's ``run`` (or a ``__call__`` other than Celery's) so that the scope opened in
    ``before_start`` is closed as the body ends, however it ends. ``takes_self=False``: ``call``
    is the function of a ``staticmethod`` ``run``, called without the task."""

    @functools.wraps(call)
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        held = getattr(celery_api.current_request(self), "lock", None)
        # the first call runs the body and closes the scope (a subclass ``__call__`` calling
        # ``super().__call__`` nests a second one, which owns nothing)
        owns = isinstance(held, LockScope) and not held._body_started
        if owns:
            held._body_started = True  # type: ignore[union-attr]
        finished = succeeded = False
        try:
            result = call(self, *args, **kwargs) if takes_self else call(*args, **kwargs)
            finished = succeeded = True
            return result
        except (Retry, Ignore, Reject):
            raise  # a retry, or a message meant to come back
        except Exception:
            finished = True  # a failure is an outcome too
            raise
        finally:
            if owns:
                # before Celery publishes successors (callbacks, chain steps): they find it free
                held.close(finished=finished, succeeded=succeeded)  # type: ignore[union-attr]

    __call__.releases_lock = True  # type: ignore[attr-defined]
    return __call__  # type: ignore[return-value]


def body_releasing(run: Any) -> Callable[..., Any]:
    """A task class's ``run`` (a function, or the ``staticmethod`` ``@app.task`` makes of an
    unbound task's function) as a method that closes the scope as the body ends.

    ``run``, not ``__call__``: the tracer calls ``run`` directly when no class overrides
    ``__call__``, without Celery's ``Task.__call__`` and the request copy it pushes (~20 us
    per task). The original stays readable as ``lock_body`` (its signature names the lock).
    """
    if isinstance(run, staticmethod):
        function = run.__func__
        wrapper = releases_after_body(function, takes_self=False)
        # The bound method's signature is the function's: drop the inherited __wrapped__
        # (inspect would otherwise take the function's first parameter for ``self``).
        del wrapper.__wrapped__  # type: ignore[attr-defined]
        wrapper.__signature__ = _with_self(function)  # type: ignore[attr-defined]
    else:
        wrapper = releases_after_body(run)
    wrapper.lock_body = run  # type: ignore[attr-defined]
    return wrapper


def _with_self(function: Callable[..., Any]) -> inspect.Signature:
    signature = inspect.signature(function)
    own = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    return signature.replace(parameters=[own, *signature.parameters.values()])


# -- the acquire that opens a scope -------------------------------------------------------------


def request_base(task: Any, options: LockOptions, has_id: bool, eager: bool) -> AcquireRequest:
    """What every acquire of ``task`` (a ``LockedTask``: not imported, it imports this module)
    asks, before the call's own name, owner and time limit; made once per resolved options for
    a worker's call (a task id, not eager)."""
    cached: Optional[tuple[LockOptions, AcquireRequest]] = task._acquire_base
    worker_call = has_id and not eager
    if worker_call and cached is not None and cached[0] is options:
        return cached[1]
    # A redelivered message of an acks_late task may repeat an execution that already
    # ran to the end: the acquire itself looks for that execution's finish record. A
    # message a parking policy (queue, replace) hands the lock twice must not run twice.
    unless_finished = bool(task.acks_late and has_id and options.finished_ttl) or (
        worker_call and options.policy.parks
    )
    # This message is no longer queued: the acquire deletes its marker (enqueue dedupe).
    take_queued = bool(options.dedupe_on_enqueue and worker_call)
    # A call that will run later stays queued while the lock is held: a retry's re-send, and
    # with 'until_started' a wait too (only a started call lets the next one be published).
    policy = options.policy
    later = policy.resends or (options.dedupe_until_started and policy.waits_in_place)
    base = AcquireRequest(
        "",
        options.ttl,
        fencing=options.fencing,
        on_lost=task._on_lock_lost,
        unless_finished=unless_finished,
        min_replicas=options.min_replicas,
        replica_timeout=options.min_replicas_timeout,
        take_queued=take_queued,
        queued_while_held=take_queued and later,
        reservation_ttl=options.send_window,
        finished_ttl=options.finished_ttl or 3600.0,
        rate=options.rate,
        cap_key=options.cap_key,
        slotted=options.slotted,
        # a static lock_limit is every call's; a callable one is each call's (its _acquire)
        limit=options.limit if type(options.limit) is int else 1,
    )
    if worker_call:
        task._acquire_base = (options, base)  # per task instance: on_lost is its own
    return base


def prepared(task: Any, options: LockOptions) -> PreparedCalls:
    """The locker of a worker's call of ``task`` and the acquire prepared for its calls (what
    a call of ``LockOptions.prepared`` goes through), made once per resolved options and
    locker; kept on the task as ``_prepared_acquire``. A forked child, or a test, makes lockers
    of its own: the app's locker is known unchanged while ``lockers.generation`` is; a
    subclass's own ``lock_locker`` is read at every call.

    Raises:
        LockBackendUnavailable: making the locker asked the server, which did not answer.
    """
    cached: Optional[PreparedCalls] = task._prepared_acquire
    if task._app_locker:
        if (
            cached is not None
            and cached.options is options
            and cached.generation == lockers.generation
        ):
            return cached
        locker = locker_for(task.app)  # may make it: the generation changes then
        generation = lockers.generation
        keep = locker_for(task.app) is locker  # else it changed meanwhile: not kept
    else:
        locker = task.lock_locker
        if cached is not None and cached.options is options and cached.locker is locker:
            return cached
        generation, keep = lockers.generation, True
    plan = PreparedCalls(
        options, generation, locker, locker.prepare(request_base(task, options, True, False))
    )
    if keep:
        task._prepared_acquire = plan
    return plan


class PreparedCalls(NamedTuple):
    """What a worker's calls of a task acquire through (see :func:`prepared`): its locker, for
    every call; the prepared acquire, for a call that asks nothing more (``LockOptions.prepared``:
    the others add fields of their own)."""

    options: LockOptions
    generation: int
    locker: LockBackend
    acquire: PreparedAcquire
