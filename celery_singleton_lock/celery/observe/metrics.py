"""Prometheus metrics of lock decisions (extra ``[metrics]``, setting ``singleton_lock_metrics``).

Names and labels follow celery-exporter (``celery_task_*_total{name, hostname,
queue_name}``), so dashboards join them on the same labels::

    celery_lock_acquired_total{name, hostname, queue_name}
    celery_lock_duplicates_total{name, hostname, queue_name, action, reason}
    celery_lock_lost_total{name, hostname, queue_name}
    celery_lock_backend_errors_total{name, hostname, queue_name}
    celery_lock_acquire_seconds{name, hostname, queue_name}   histogram: received -> lock held
    celery_lock_held_seconds{name, hostname, queue_name}      histogram: held -> release sent
    celery_lock_parked{name}                      gauge: calls parked behind locks now

``queue_name`` is the queue the call came in on: its message's routing key (the queue's name
with Celery's default routing), ``celery`` when unknown, as celery-exporter says then. The
parked gauge is read from the lock server, which does not know the queue.

Why prometheus_client's multiprocess mode rather than aggregating in the main process: a
prefork pool child counts into a memory-mapped file of its own (``<kind>_<pid>.db`` in one
directory), and the main process sums every file when scraped. A write is a store into a
shared mapping, so a child killed with SIGKILL loses nothing it counted; aggregation in the
main process would need a channel from every child and would lose what a dead child had not
sent yet. The directory is chosen and exported (``PROMETHEUS_MULTIPROC_DIR``) at
``worker_init``, in the main process before the pool forks, so every child writes there. The
files of a child that exits are added into an archive and removed (:mod:`.process_files`), so
the directory holds about 2 files per live process, not 2 per child ever forked.

Cost: nothing is connected while the setting is off (the lock signals are sent only when they
have receivers). On, each decision is a signal dispatch and a locked file-mapping write.

The parked gauge is not counted by processes: it is read from the lock server when scraped
(a bounded SCAN of the parked lists), the same on every worker of a prefix.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from typing import Any, Iterator, Optional

from redis.exceptions import RedisError

from celery_singleton_lock.celery.config.app_settings import metrics_port
from celery_singleton_lock.celery.config.lockers import locker_for
from celery_singleton_lock.celery.observe import timing
from celery_singleton_lock.celery.observe.serving import quiet_server
from celery_singleton_lock.celery.signals import (
    lock_acquired,
    lock_backend_error,
    lock_duplicate,
    lock_lost,
    lock_released,
)
from celery_singleton_lock.errors import LockConfigurationError, LockError

log = logging.getLogger("celery_singleton_lock.metrics")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
ACQUIRE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
HELD_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)
#: The parked gauge looks at no more than this many parked lists per scrape.
PARKED_SCAN_LIMIT = 10_000

_hostname = ""
_metrics: Optional[_Metrics] = None
_server: Any = None
#: the directory this worker made for itself, removed at its shutdown
_temporary: Optional[str] = None


def enabled(conf: Any) -> bool:
    """True when the app turns the metrics on."""
    return bool(conf.get("singleton_lock_metrics"))


def check_settings(conf: Any) -> None:
    """Validate the metrics settings (at worker start).

    Raises:
        LockConfigurationError: naming the setting, or the missing extra.
    """
    metrics_port(conf)
    if not enabled(conf):
        return
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise LockConfigurationError(
            "singleton_lock_metrics is on but prometheus_client is not installed: "
            "install the package's [metrics] extra, or prometheus_client itself"
        ) from None


class _Metrics:
    """The metric objects; their values live in the multiprocess directory."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Histogram

        labels = ("name", "hostname", "queue_name")
        # registry=None: multiprocess values are files, collected by MultiProcessCollector
        self.acquired = Counter(
            "celery_lock_acquired", "Locks taken before a body ran.", labels, registry=None
        )
        self.duplicates = Counter(
            "celery_lock_duplicates",
            "Calls that found their lock taken, by what they did (action) and why (reason).",
            (*labels, "action", "reason"),
            registry=None,
        )
        self.lost = Counter(
            "celery_lock_lost", "Locks lost while their body ran.", labels, registry=None
        )
        self.backend_errors = Counter(
            "celery_lock_backend_errors",
            "Acquires that could not reach the lock server.",
            labels,
            registry=None,
        )
        self.acquire_seconds = Histogram(
            "celery_lock_acquire_seconds",
            "Seconds from the message received by the worker to its lock held, waits included.",
            labels,
            buckets=ACQUIRE_BUCKETS,
            registry=None,
        )
        self.held_seconds = Histogram(
            "celery_lock_held_seconds",
            "Seconds a lock was held, from acquire to release.",
            labels,
            buckets=HELD_BUCKETS,
            registry=None,
        )


#: ``queue_name`` when the call's queue is unknown (celery-exporter's own default)
DEFAULT_QUEUE = "celery"
#: the queue of each call holding a lock in this process, by task id: a lost lock and a
#: release are signalled by task id, maybe from the renewer thread, where the request is not
_queue_of: dict[str, str] = {}
#: calls remembered at most (a lock never released: a crash of its body's thread)
MAX_REMEMBERED = 10_000


def _name(sender: Any) -> str:
    return str(getattr(sender, "name", None) or "")


def _queue(sender: Any) -> str:
    """The queue of the call ``sender`` runs in this thread (its message's routing key)."""
    request = getattr(sender, "request", None)
    info = getattr(request, "delivery_info", None) or {}
    return str(info.get("routing_key") or DEFAULT_QUEUE)


def _on_acquired(sender: Any = None, task_id: Optional[str] = None, **_: Any) -> None:
    if _metrics is None:
        return
    queue = _queue(sender)
    if task_id:
        if len(_queue_of) >= MAX_REMEMBERED:
            _queue_of.clear()
        _queue_of[task_id] = queue
    _metrics.acquired.labels(_name(sender), _hostname, queue).inc()
    waited = timing.waited(task_id)
    if waited is not None:
        _metrics.acquire_seconds.labels(_name(sender), _hostname, queue).observe(waited)


def _on_duplicate(sender: Any = None, action: str = "", reason: str = "held", **_: Any) -> None:
    if _metrics is not None:
        _metrics.duplicates.labels(_name(sender), _hostname, _queue(sender), action, reason).inc()


def _on_lost(sender: Any = None, task_id: Optional[str] = None, **_: Any) -> None:
    if _metrics is not None:
        queue = _queue_of.get(task_id or "", DEFAULT_QUEUE)
        _metrics.lost.labels(_name(sender), _hostname, queue).inc()


def _on_backend_error(sender: Any = None, **_: Any) -> None:
    if _metrics is not None:
        _metrics.backend_errors.labels(_name(sender), _hostname, _queue(sender)).inc()


def _on_released(sender: Any = None, task_id: Optional[str] = None, **_: Any) -> None:
    held = timing.held(task_id)
    queue = _queue_of.pop(task_id or "", DEFAULT_QUEUE)
    if _metrics is not None and held is not None:
        _metrics.held_seconds.labels(_name(sender), _hostname, queue).observe(held)


_RECEIVERS = (
    (lock_acquired, _on_acquired),
    (lock_duplicate, _on_duplicate),
    (lock_lost, _on_lost),
    (lock_backend_error, _on_backend_error),
    (lock_released, _on_released),
)


def _choose_directory(conf: Any) -> str:
    from celery_singleton_lock.celery.observe import process_files

    chosen = conf.get("singleton_lock_metrics_dir")
    if chosen:
        os.makedirs(chosen, exist_ok=True)
        # counts of an earlier run would add up with this one's
        for entry in os.listdir(chosen):
            if entry.endswith(".db"):
                os.unlink(os.path.join(chosen, entry))
        process_files.own(chosen)
        return str(chosen)
    existing = os.environ.get(MULTIPROC_ENV)
    if existing:  # the user's own multiprocess setup: their collector serves ours too
        return existing
    global _temporary
    _temporary = tempfile.mkdtemp(prefix="celery-lock-metrics-")
    process_files.own(_temporary)
    return _temporary


def set_up(app: Any, hostname: Optional[str]) -> Optional[str]:
    """Turn the metrics on for this worker: in its main process, before the pool forks
    (``worker_init``). Returns the multiprocess directory; None when the metrics are off or
    prometheus_client is missing (the configuration check then refuses the worker)."""
    global _hostname
    if not enabled(app.conf):
        return None
    try:
        from prometheus_client import values
    except ImportError:
        return None
    directory = _choose_directory(app.conf)
    os.environ[MULTIPROC_ENV] = directory
    # prometheus_client picks its value class at import, which may predate the variable
    values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
    _hostname = hostname or ""
    connect()
    app.conf.singleton_lock_metrics_dir = directory  # for the console and register_collectors
    return directory


def connect(sender: Any = None) -> None:
    """Count from now on (in ``$PROMETHEUS_MULTIPROC_DIR``, set first); the decisions of
    ``sender`` only if given (the bench's metrics-on contender)."""
    global _metrics
    if _metrics is None:
        _metrics = _Metrics()
    for signal, receiver in _RECEIVERS:
        uid = f"csl-metrics-{receiver.__name__}"
        signal.connect(receiver, sender=sender, weak=False, dispatch_uid=uid)
    timing.connect(sender, user="metrics")


def retire_process(**_: Any) -> None:
    """Add this pool child's counts into the archive and remove its files
    (``worker_process_shutdown``, in the child, once its locks are released)."""
    directory = os.environ.get(MULTIPROC_ENV)
    if directory and _metrics is not None:
        from celery_singleton_lock.celery.observe import process_files

        process_files.retire(directory, os.getpid())


def tear_down(sender: Any = None) -> None:
    """Disconnect what :func:`connect` with this ``sender`` connected (tests, the bench);
    counts already written stay."""
    global _metrics
    for signal, receiver in _RECEIVERS:
        signal.disconnect(sender=sender, dispatch_uid=f"csl-metrics-{receiver.__name__}")
    timing.disconnect(sender, user="metrics")
    _metrics = None


class ParkedCollector:
    """``celery_lock_parked{name}``: calls parked behind locks, read from the lock server at
    each scrape (bounded SCAN of ``<prefix>:{*}:parked``)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily(
            "celery_lock_parked",
            "Calls parked behind locks (on_duplicate='queue').",
            labels=["name"],
        )
        try:
            counts = parked_by_task(locker_for(self.app))
        except (LockError, RedisError) as exc:
            # during an outage, above all, the counters must still be served (the backend
            # errors among them): a raise here made the whole scrape a 500
            log.warning("celery_lock_parked not read: %s", exc)
            counts = {}
        else:
            # a task that can park reads 0 when nothing is parked, rather than vanishing
            for name in parking_task_names(self.app):
                counts.setdefault(name, 0)
        for name, count in sorted(counts.items()):
            family.add_metric([name], count)
        yield family


def parking_task_names(app: Any) -> list[str]:
    """The names ``celery_lock_parked`` gives the app's tasks that park duplicates (policies
    ``queue`` and ``replace``): the lock name before its digest."""
    names = []
    for task in list(app.tasks.values()):
        options = getattr(task, "_lock_options", None)
        if options is not None and options.policy.parks:
            names.append(f"{options.keyer.namespace}{options.keyer.head}")  # or its group
    return names


def parked_by_task(locker: Any) -> dict[str, int]:
    """Calls parked behind locks now, by task name (the lock name before its digest)."""
    if locker.queue is None:  # a quorum parks nothing ('queue' is refused)
        return {}
    # the reader's parked locks: on Redis the hand-off index (two round trips, no SCAN), on
    # PostgreSQL one SELECT of its parked rows (O(locks with parked calls) either way)
    counts: dict[str, int] = {}
    for lock_name, count, _ in locker.inspect.parked_locks(PARKED_SCAN_LIMIT):
        task = lock_name.rsplit(":", 1)[0]
        counts[task] = counts.get(task, 0) + count
    return counts


def register_collectors(registry: Any, app: Any, directory: Optional[str] = None) -> None:
    """Add the lock metrics to ``registry``, a ``prometheus_client.CollectorRegistry`` you
    already serve: every pool process's counts (from ``directory``, default the app's
    ``singleton_lock_metrics_dir``), those of dead processes merged first, and the parked
    gauge."""
    from celery_singleton_lock.celery.observe import process_files

    path = directory or app.conf.get("singleton_lock_metrics_dir") or os.environ.get(MULTIPROC_ENV)
    if not path:
        raise LockConfigurationError(
            "no metrics directory: set singleton_lock_metrics_dir (the one the worker writes)"
        )
    process_files.MergingCollector(registry, path=path)  # type: ignore[no-untyped-call]
    registry.register(ParkedCollector(app))


def serve(app: Any) -> None:
    """Serve ``/metrics`` on ``singleton_lock_metrics_port`` from the worker's main process
    (``worker_ready``); nothing when the port is None or the metrics are off."""
    global _server
    port = metrics_port(app.conf)
    if _metrics is None or port is None or _server is not None:
        return
    from prometheus_client import CollectorRegistry, make_wsgi_app

    registry = CollectorRegistry()
    register_collectors(registry, app)
    address = app.conf.get("singleton_lock_metrics_address") or "127.0.0.1"
    try:
        _server = quiet_server(address, port, make_wsgi_app(registry))
    except OSError as exc:
        log.error("lock metrics not served on %s:%s: %s", address, port, exc)
        return
    threading.Thread(
        target=_server.serve_forever, name="celery-singleton-lock-metrics", daemon=True
    ).start()
    log.info("lock metrics served on http://%s:%s/metrics", address, _server.server_port)


def stop_serving() -> None:
    """Stop the ``/metrics`` server and remove the directory the worker made for its counts
    (``worker_shutdown``, main process, after the pool has stopped)."""
    global _server, _temporary
    if _server is not None:
        _server.shutdown()
        _server.server_close()
        _server = None
    if _temporary is not None:
        shutil.rmtree(_temporary, ignore_errors=True)
        _temporary = None
