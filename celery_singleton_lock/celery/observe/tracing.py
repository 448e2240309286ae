"""OpenTelemetry span events for lock decisions, when ``opentelemetry-api`` is installed.

The OpenTelemetry Celery instrumentation wraps each execution in a ``run/<task>`` span that is
current in the thread running ``before_start``. The receivers below add to whatever span is
current and recording there: attributes ``celery.lock.key`` / ``celery.lock.fence`` /
``celery.lock.waited_seconds`` and the events ``lock.acquired``, ``lock.duplicate`` (action,
reason, holder) and ``lock.lost``. A lock is lost in the renewer thread, where the task's span
is not current: the span current at the acquire is kept, by task id, until the release.

Connected at worker start only when ``opentelemetry`` imports and the setting
``singleton_lock_trace_events`` is not False; no hard dependency. A process that reaches its
first lock with no tracer provider set (the API alone, installed as another package's
dependency: no span can record) disconnects them again, so that it pays nothing per task
(measured ~12 us per task with ``python -m bench fastpath``). Set the SDK's tracer provider
before the first task runs (at import, or in ``worker_process_init`` as the OpenTelemetry
Celery instrumentation does).
"""

from __future__ import annotations

from typing import Any, Optional

from celery import signals

from celery_singleton_lock.celery.observe import timing
from celery_singleton_lock.celery.signals import lock_acquired, lock_duplicate, lock_lost
from celery_singleton_lock.engine import reset_in_forked_children

#: the recording span of each execution holding its lock in this process, by task id
_spans: dict[str, Any] = {}


def available() -> bool:
    try:
        from opentelemetry import trace  # noqa: F401
    except ImportError:
        return False
    return True


#: ``opentelemetry.trace.get_current_span``, imported at the first acquire: an import statement
#: at every acquire cost more than the rest of the receiver (measured in ``bench fastpath``)
_get_current_span: Any = None


def _recording_span() -> Any:
    """The span current and recording in this thread, or None (always None in a process with
    no tracer provider, whose receivers are disconnected then: see :func:`_no_provider`)."""
    global _get_current_span
    if _provider_set is None and _no_provider():
        return None
    if _get_current_span is None:
        from opentelemetry.trace import get_current_span

        _get_current_span = get_current_span
    span = _get_current_span()
    return span if span.is_recording() else None


#: whether this process has a tracer provider: None until its first lock (a forked child
#: looks again: its provider may be set in ``worker_process_init``)
_provider_set: Optional[bool] = None


class _ForkedChildLooksAgain:
    def after_fork_in_child(self) -> None:
        global _provider_set
        _provider_set = None


_child_looks_again = _ForkedChildLooksAgain()
reset_in_forked_children(_child_looks_again)


def _no_provider() -> bool:
    """True, once, in a process whose spans can never record: the receivers are disconnected
    then (see the module docstring)."""
    global _provider_set
    if _provider_set is None:
        from opentelemetry import trace

        _provider_set = not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
        if not _provider_set:
            disconnect()
            return True
    return False


def _on_acquired(
    task_id: Optional[str] = None, key: str = "", fence: Optional[int] = None, **_: Any
) -> None:
    span = _recording_span()
    if span is None:
        return
    attributes: dict[str, Any] = {"celery.lock.key": key}
    if fence is not None:
        attributes["celery.lock.fence"] = fence
    waited = timing.waited(task_id)
    if waited is not None:
        attributes["celery.lock.waited_seconds"] = waited
    span.set_attributes(attributes)
    span.add_event("lock.acquired", attributes)
    if task_id:
        _spans[task_id] = span


def _on_duplicate(
    key: str = "", holder: Any = None, action: str = "", reason: str = "held", **_: Any
) -> None:
    span = _recording_span()
    if span is None:
        return
    holder_id = (holder or {}).get("task_id") if isinstance(holder, dict) else None
    attributes = {
        "celery.lock.key": key,
        "celery.lock.action": action,
        "celery.lock.reason": reason,
    }
    if holder_id:
        attributes["celery.lock.holder"] = str(holder_id)
    span.add_event("lock.duplicate", attributes)


def _on_lost(task_id: Optional[str] = None, key: str = "", **_: Any) -> None:
    span = _spans.get(task_id) if task_id else None
    if span is not None and span.is_recording():
        span.add_event("lock.lost", {"celery.lock.key": key})


def _forget(task_id: Optional[str] = None, **_: Any) -> None:
    if task_id:
        _spans.pop(task_id, None)


_RECEIVERS = (
    (lock_acquired, _on_acquired),
    (lock_duplicate, _on_duplicate),
    (lock_lost, _on_lost),
    (signals.task_postrun, _forget),
)


def connect(conf: Any) -> bool:
    """Add lock events to spans from now on; False when opentelemetry is not installed or
    the setting turns them off."""
    global _provider_set
    if conf.get("singleton_lock_trace_events") is False or not available():
        return False
    _provider_set = None  # looked at again at the next lock
    for signal, receiver in _RECEIVERS:
        signal.connect(receiver, weak=False, dispatch_uid=f"csl-trace-{receiver.__name__}")
    timing.connect(user="tracing")
    return True


def disconnect() -> None:
    for signal, receiver in _RECEIVERS:
        signal.disconnect(dispatch_uid=f"csl-trace-{receiver.__name__}")
    timing.disconnect(user="tracing")
    _spans.clear()
