"""Every Celery behaviour and internal the Celery layer relies on beyond its documented API.

Each one is pinned by a test in ``tests/celery/test_celery_api.py`` that fails on a Celery
release that changes it; the rest of the layer reaches them only through here. What the layer
also relies on, pinned elsewhere:

- the tracer calls an overridden ``Task.__call__`` instead of ``run``, and ``run`` itself,
  without ``Task.__call__``, when no class overrides it; ``Ignore`` raised in ``before_start``
  ends the task IGNORED (``test_celery_api``);
- ``delivery_info["redelivered"]`` on a message the Redis broker handed out again
  (``test_real_workers``: the redelivery tests);
- ``task_failure`` (``WorkerLostError``, ``TimeLimitExceeded``) and ``task_revoked`` sent in the
  worker's main process when a child dies (``test_real_workers``: the prefork exit paths).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any, Optional

from billiard.einfo import ExceptionInfo
from celery import VERSION, states
from celery.app.task import Context
from celery.app.trace import TraceInfo, trace_ok_t
from celery.canvas import group, signature
from kombu import serialization
from kombu.exceptions import KombuError, OperationalError
from redis.exceptions import RedisError

log = logging.getLogger("celery_singleton_lock.worker")

# Reading or storing a state may fail with no result backend configured, or with it down.

BACKEND_ERRORS: tuple[type[BaseException], ...] = (
    NotImplementedError,
    OSError,
    RedisError,
    OperationalError,
)
#: What storing a state may raise: a backend error, or a state the result serializer cannot
#: encode (``EncodeError``, a ``KombuError``: with ``result_extended`` a state holds the call's
#: arguments, which JSON results cannot hold for a pickled call). It costs the state only.
STORE_ERRORS: tuple[type[BaseException], ...] = (KombuError, *BACKEND_ERRORS)

try:  # Celery >= 5.5: the request may override the task's ignore_result either way
    from celery.app.task import get_actual_ignore_result as _actual_ignore_result
except ImportError:  # pragma: no cover - older Celery: the request can only add it
    _actual_ignore_result = None


def declare_request_attribute(name: str) -> None:
    """Make ``request.<name>`` request state rather than a message header.

    Celery turns every request attribute that ``Context`` does not declare into a custom
    header when it copies a request (``Task.push_request``), and would then serialize it into
    the messages it sends (retries, chain steps). Declaring it also gives ``None`` to requests
    that never set it (a direct call). No public hook exists for this.
    """
    if not hasattr(Context, name):
        setattr(Context, name, None)


#: Celery >= 5.5 starts the request that ``Task.__call__`` pushes for the body as a copy of the
#: current one. Before, it started empty: outside the worker's optimized path (eager runs,
#: ``start_worker``) a task with its own ``__call__`` (``LockedTask``) saw no ``request.id``
#: and no ``request.lock`` in its body.
PUSH_REQUEST_COPIES = tuple(VERSION[:2]) >= (5, 5)


def push_request_copying_the_current(task: Any, *args: Any, **kwargs: Any) -> None:
    """``Task.push_request`` as Celery 5.5 made it, for the releases before."""
    task.request_stack.push(Context(*args, **{**task.request.__dict__, **kwargs}))


def current_request(task: Any) -> Any:
    """The request the task runs now, without building a default one (``Task.request`` does)."""
    return task.request_stack.top


def header(request: Any, name: str) -> Any:
    """A custom message header of ``request`` (Celery also mirrors them as attributes)."""
    headers = getattr(request, "headers", None)
    if headers and name in headers:
        return headers[name]
    return getattr(request, name, None)


def is_redelivered(request: Any) -> bool:
    """The broker handed this message out before (``acks_late``, visibility timeout)."""
    return bool((getattr(request, "delivery_info", None) or {}).get("redelivered"))


def hard_time_limit(request: Any) -> Optional[float]:
    """The hard time limit the message carries, if any."""
    limits = request.timelimit
    return float(limits[0]) if limits and limits[0] else None


def ignores_result(task: Any, request: Any) -> bool:
    """True if no state is stored for this execution (``ignore_result``, or eager)."""
    if request.is_eager:
        return True
    if _actual_ignore_result is None:  # pragma: no cover - older Celery
        return bool(task.ignore_result or request.ignore_result)
    return bool(_actual_ignore_result(task, request))


def store_started(task: Any, task_id: str, request: Any, meta: dict[str, Any]) -> None:
    """Store STARTED as the tracer does with ``track_started``."""
    task.backend.store_result(task_id, meta, states.STARTED, request=request)


def store_retry(task: Any, request: Any, reason: BaseException) -> None:
    """Store RETRY with ``reason`` as its result, as ``Task.retry`` does."""
    task.backend.mark_as_retry(request.id, reason, request=request)


def store_not_run(task: Any, request: Any, exc: BaseException) -> None:
    """Store REVOKED with ``exc`` as its result: a call not run on purpose (a skipped
    duplicate). As ``Backend.mark_as_revoked`` stores a revoke, but with ``exc`` instead of a
    bare ``TaskRevokedError``: REVOKED is a ready, propagating, exception state, so
    ``AsyncResult.get()`` raises ``exc`` rebuilt, ``ready()`` is true and ``failed()`` false
    (FAILURE is what dashboards and alerts count). No errbacks, no ``task_failure`` (Celery
    calls none for a revoked task); a chord member counts as revoked (the chord fails, as
    with any revoked header task)."""
    task.backend.store_result(request.id, exc, states.REVOKED, traceback=None, request=request)
    if request.chord:
        task.backend.on_chord_part_return(request, states.REVOKED, exc)


def outcome_is_stored(task: Any, task_id: str) -> bool:
    """True if a ready state (SUCCESS, FAILURE, REVOKED...) is stored under ``task_id``."""
    return task.backend.get_task_meta(task_id).get("status") in states.READY_STATES


def stored_outcome(task: Any, task_id: str) -> Optional[tuple[str, Any]]:
    """The ready state stored under ``task_id`` and its result (the exception, rebuilt, for a
    failure), or None while none is stored."""
    meta = task.backend.get_task_meta(task_id)
    status = meta.get("status")
    if status not in states.READY_STATES:
        return None
    return str(status), meta.get("result")


def died_without_outcome(state: str, result: Any) -> bool:
    """True for what Celery's main process stores as the outcome of a task whose pool child
    died under it (``kill -9``, the OOM killer): ``WorkerLostError``
    (celery/worker/request.py, ``on_failure``). The body did not end: nothing to join."""
    return state == states.FAILURE and type(result).__name__ == "WorkerLostError"


def message_priority(request: Any) -> Optional[int]:
    """The ``priority`` the call's message was sent with (its AMQP property, which the worker's
    ``Request`` copies into ``delivery_info``; celery/worker/request.py), or None."""
    priority = (getattr(request, "delivery_info", None) or {}).get("priority")
    return priority if type(priority) is int else None


def dispatch_callbacks_and_chain(task: Any, request: Any, retval: Any) -> None:
    """Send the link callbacks and the next chain step of ``request`` with ``retval``, as the
    tracer does after a body returns (celery/app/trace.py; ``_dispatch_callbacks_and_chain``
    since Celery 5.6, inline before): groups among several callbacks are sent on their own,
    the other callbacks as one group; the chain's last entry is the next step."""
    app = task.app
    parent_id = request.id
    root_id = request.root_id or request.id
    priority = None
    if app.conf.task_inherit_parent_priority:
        priority = (request.delivery_info or {}).get("priority")
    sent = {"parent_id": parent_id, "root_id": root_id, "priority": priority}
    callbacks = request.callbacks or []
    if len(callbacks) == 1:
        signature(callbacks[0], app=app).apply_async((retval,), **sent)
    elif callbacks:
        signatures = [signature(callback, app=app) for callback in callbacks]
        for each in signatures:
            if isinstance(each, group):
                each.apply_async((retval,), **sent)
        others = [each for each in signatures if not isinstance(each, group)]
        if others:
            group(others, app=app).apply_async((retval,), **sent)
    chain = request.chain
    if chain:
        signature(chain[-1], app=app).apply_async((retval,), chain=chain[:-1], **sent)


def finish_as(task: Any, request: Any, state: str, result: Any) -> None:
    """End the execution of ``request`` with an outcome it did not compute, as the tracer ends
    one whose body returned ``result`` (SUCCESS) or raised it (any other ready state): the
    callbacks and the next chain step are sent, the state is stored under its own id, a chord
    member counts towards its chord (``on_chord_part_return``), errbacks are called once.
    The caller then raises ``Ignore``: the tracer stores nothing more."""
    store = not ignores_result(task, request)
    if state == states.SUCCESS:
        dispatch_callbacks_and_chain(task, request, result)
        task.backend.mark_as_done(request.id, result, request=request, store_result=store)
        return
    task.backend.mark_as_failure(
        request.id, result, request=request, store_result=store, call_errbacks=True
    )


#: Field of a locked task's request dict (so ``self.request.<field>``) holding the content type
#: of the message it came in (see :mod:`.task.worker_request`).
CONTENT_TYPE_FIELD = "singleton_lock_content_type"
#: Field of a locked task's request dict holding the wall-clock time (``time.time()``) the
#: worker received its message, or its ETA if later (see :mod:`.task.worker_request`).
RECEIVED_FIELD = "singleton_lock_received"


def serializer_of(request: Any) -> dict[str, Any]:
    """``{"serializer": name}`` of the message ``request`` came in, for a re-send that keeps
    it; empty when unknown (the re-send then takes the task's own serializer)."""
    content_type = getattr(request, CONTENT_TYPE_FIELD, None)
    name = serialization.registry.type_to_name.get(content_type) if content_type else None
    return {"serializer": name} if name else {}


def send_again(task: Any, request: Any, *, countdown: float, headers: dict[str, Any]) -> None:
    """Send the message of ``request`` again, same task id and serializer, after ``countdown``
    seconds, with ``headers``; Celery's own ``retries`` count is kept as it is."""
    signature = task.signature_from_request(
        request,
        countdown=countdown,
        headers=headers,
        retries=request.retries,
        **serializer_of(request),
    )
    signature.apply_async()


def message_of(task: Any, request: Any, *, headers: dict[str, Any]) -> dict[str, Any]:
    """The message of ``request`` as a signature (a plain dict: task name, arguments and the
    options that route it: task id, queue, chord, links, parent, serializer...), with
    ``headers``, to be sent later with :func:`send_message`; Celery's own ``retries`` count
    is kept."""
    return dict(
        task.signature_from_request(
            request, headers=headers, retries=request.retries, **serializer_of(request)
        )
    )


def send_message(app: Any, message: dict[str, Any]) -> None:
    """Send a message made by :func:`message_of`, under its own task id, now."""
    signature(message, app=app).apply_async()


def registered_instances(app: Any, cls: type) -> list[Any]:
    """Tasks of exactly class ``cls`` registered with ``app``, without finalizing it.

    ``app.register_task(Task())`` names the instance, not its class, before binding it.
    """
    tasks: list[Any] = list(app._tasks.values())
    return [task for task in tasks if type(task) is cls and getattr(task, "name", None)]


# -- the worker's main process: requests running in pool children -------------------------

#: Attempts at copying ``active_requests`` (a WeakSet the consumer thread changes meanwhile).
SNAPSHOT_ATTEMPTS = 5


def running_requests() -> list[Any]:
    """The worker's requests accepted and not yet ended (``celery.worker.state``), as a copy;
    empty if the set kept changing while being copied."""
    from celery.worker import state  # the worker's own module: only imported in workers

    for _ in range(SNAPSHOT_ATTEMPTS):
        try:
            return list(state.active_requests)
        except RuntimeError:  # "set changed size during iteration": copy it again
            continue
    return []


def child_pid(request: Any) -> Optional[int]:
    """The pid of the pool process that accepted ``request`` (a worker ``Request``); None
    until one has."""
    return getattr(request, "worker_pid", None) or None


def accepted_hard_time_limit(request: Any) -> Optional[float]:
    """The hard time limit of a worker ``Request`` (``time_limits``, not the task
    ``Context``'s ``timelimit``)."""
    limits = getattr(request, "time_limits", None) or (None,)
    return float(limits[0]) if limits[0] else None


def accepted_at(request: Any) -> Optional[float]:
    """Wall-clock time the pool accepted a worker ``Request`` (its hard limit counts from
    there); None until then."""
    started = getattr(request, "time_start", None)
    return float(started) if started else None


def terminate(request: Any, pool: Any, reason: str) -> None:
    """Terminate the pool child running worker ``request`` as ``revoke(terminate=True)`` does
    (``Request.terminate``: SIGTERM, then the request announced revoked: REVOKED stored,
    ``task-revoked`` sent, the message acked, ``task_revoked`` sent with ``terminated``), but
    with ``reason`` stored, not "terminated": a waiter on the result reads the first state
    published, so the reason must be right the first time."""
    signum = signal.SIGTERM
    pool.terminate_job(request.worker_pid, signum)
    request._announce_revoked(reason, True, signum, False)


def request_context(request: Any) -> Any:
    """The task ``Context`` of worker ``request`` (what Celery's own revoke stores with)."""
    return request._context


def runs_bodies_in_children(consumer: Any) -> bool:
    """True when the worker runs task bodies in prefork pool children."""
    from celery.concurrency.prefork import TaskPool  # billiard: only imported in workers

    return isinstance(getattr(consumer, "pool", None), TaskPool)


# -- ending an execution the tracer ignores, without its traceback work -------------------------


class EndedQuietly(BaseException):
    """Ends an execution as ``Ignore`` does (IGNORED: nothing stored, the message acked), in a
    worker, without the cost of Celery's ``except Ignore``: it builds billiard's
    ``ExceptionInfo`` twice, copying every frame's code positions (the tracer's own is ~2,300
    instructions) and formatting the traceback, ~1-3 ms, for an INFO line this package drops.
    Raised only inside a tracer wrapped by :func:`quiet_ends` (:func:`can_end_quietly`). A
    ``BaseException`` the tracer does not catch: it runs its ``finally`` blocks (``task_postrun``
    with ``state=None``, the request popped, the backend's clean-up) and lets it through."""

    def __init__(self, ignore: BaseException) -> None:
        super().__init__(ignore)
        self.ignore = ignore


class _Tracing(threading.local):
    inside = False


_tracing = _Tracing()


def can_end_quietly() -> bool:
    """True while this thread runs a tracer wrapped by :func:`quiet_ends`."""
    return _tracing.inside


def quiet_ends(tracer: Any) -> Any:
    """``tracer`` (a task's ``__trace__``, which the worker builds and assigns: consumer.py
    ``update_strategies``, prefork.py ``process_initializer``) made to turn
    :class:`EndedQuietly` into the outcome the tracer gives an ``Ignore``: info IGNORED, the
    worker then acks the message (worker/request.py ``on_failure``)."""
    if tracer is None or getattr(tracer, "quiet_ends", False):
        return tracer

    def trace(uuid: str, args: Any, kwargs: Any, request: Any = None) -> Any:
        _tracing.inside = True
        started = time.monotonic()
        try:
            return tracer(uuid, args, kwargs, request)
        except EndedQuietly as end:
            _own_ignore.task_id = None  # no "ignored" line comes for it to drop
            ignored = ExceptionInfo.__new__(ExceptionInfo)  # no traceback to copy
            ignored.type, ignored.exception, ignored.tb = type(end.ignore), end.ignore, None
            ignored.traceback, ignored.internal = "", True
            info = TraceInfo(states.IGNORED, end.ignore)
            return trace_ok_t(ignored, info, time.monotonic() - started, None)
        finally:
            _tracing.inside = False

    trace.quiet_ends = True  # type: ignore[attr-defined]
    return trace


# -- what an operator sees ---------------------------------------------------------------------


def task_events_at_start(worker: Any) -> bool:
    """True if the starting worker (the ``worker_init`` sender) sends task events:
    ``worker_send_task_events`` or ``-E`` (celery/worker/worker.py, ``setup_defaults``)."""
    return bool(getattr(worker, "task_events", False))


def sends_task_events(consumer: Any) -> bool:
    """True if the worker's consumer sends task events now: its dispatcher is enabled and its
    groups take ``task`` (no groups: all). ``celery control enable_events`` (which Flower
    sends) adds the group at run time, ``disable_events`` removes it
    (celery/worker/control.py); the consumer's ``Events`` step makes the dispatcher."""
    dispatcher = getattr(consumer, "event_dispatcher", None)
    if dispatcher is None or not dispatcher.enabled:
        return False
    return not dispatcher.groups or "task" in dispatcher.groups


class _OwnIgnores(threading.local):
    task_id: Optional[str] = None


_own_ignore = _OwnIgnores()


def logged_already(task_id: str) -> None:
    """The ``Ignore`` this thread raises next, for ``task_id``, ends a decision already logged
    at its own level (a skip, a lock retry, a dropped copy): Celery's INFO line
    "Task <name>[<id>] ignored" that follows would only repeat it."""
    _own_ignore.task_id = task_id


class _DropRepeatedIgnores(logging.Filter):
    """Drops the tracer's "ignored" line of a decision :func:`logged_already` announced."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = record.args
        if (
            _own_ignore.task_id is not None
            and isinstance(context, dict)
            and context.get("description") == "ignored"
            and context.get("id") == _own_ignore.task_id
        ):
            _own_ignore.task_id = None
            return False
        return True


# The tracer logs through this logger (celery/app/trace.py: ``logger = get_logger(__name__)``).
TRACE_LOGGER = "celery.app.trace"
logging.getLogger(TRACE_LOGGER).addFilter(_DropRepeatedIgnores())
