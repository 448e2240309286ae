"""A task's lock options resolved and checked: task attribute, else app setting
``singleton_lock_<name>``, else the default declared in :mod:`.options`; every value checked
at registration (and again at worker start for settings changed since), each error naming the
task and the option."""

from __future__ import annotations

import difflib
import inspect
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from celery_singleton_lock.arguments import ArgumentKeyer
from celery_singleton_lock.celery.config.backend_support import (
    capabilities_from_settings,
    refuse_unsupported,
)
from celery_singleton_lock.celery.config.latest_wins import check_latest_wins
from celery_singleton_lock.celery.config.limits import (
    checked_cooldown,
    checked_limit,
    checked_rate,
)
from celery_singleton_lock.celery.config.options import (
    APP_SETTINGS,
    BACKEND_ERROR_POLICIES,
    CELERY_SINGLETON_SETTINGS,
    KNOWN_SETTINGS,
    LISTED_IN,
    MAX_TTL,
    MIN_TTL,
    POLICIES,
    TASK_OPTIONS,
    UNSET,
)
from celery_singleton_lock.engine import LockKeys, validate_prefix
from celery_singleton_lock.errors import LockConfigurationError

#: What a lock option of a task looks like; such an attribute that no class of this package
#: declares is taken for a misspelt option (:func:`check_option_names`).
LOCK_OPTION_NAME = re.compile(r"lock_|on_dup|dedup")
_OURS = "celery_singleton_lock."


@dataclass(frozen=True)
class LockOptions:
    """The resolved, validated lock options of one task."""

    task_name: str
    keyer: ArgumentKeyer
    prefix: str
    ttl: float
    on_duplicate: str
    fencing: bool
    retry_backoff: float
    retry_backoff_max: float
    max_retries: Optional[int]
    wait_timeout: float
    on_backend_error: str
    #: seconds an ``acks_late`` task's finish is remembered under its lock (see LockedTask);
    #: None: not at all
    finished_ttl: Optional[float] = 3600.0
    #: replicas that must acknowledge the acquire (and its fence) before the body runs, and
    #: how long to wait for them (seconds)
    min_replicas: int = 0
    min_replicas_timeout: float = 1.0
    #: the task's hard time limit when its message names none (task attribute, else the
    #: ``task_time_limit`` setting): renewal never outlives it
    default_time_limit: Optional[float] = None
    #: ``apply_async()`` publishes nothing while the lock name is queued or running
    dedupe_on_enqueue: bool = False
    #: seconds a queued marker lives when its message never reaches a worker (purged, lost)
    queued_ttl: float = 3600.0
    #: policy ``queue``: seconds a lock handed to a parked message stays reserved for it
    handoff_timeout: float = 60.0
    #: policy ``replace``: seconds each call is held back, and the bound of a burst (None:
    #: no debounce; no bound)
    debounce: Optional[float] = None
    debounce_max: Optional[float] = None
    #: at most this many holders per key (an int >= 1, or a callable of the bound arguments)
    limit: Any = 1
    #: seconds the key stays taken after a body ends (None: not at all), and after which ends
    cooldown: Optional[float] = None
    cooldown_after: str = "success"
    #: at most ``rate[0]`` body starts per key in any ``rate[1]`` seconds, or None
    rate: Optional[tuple[int, float]] = None
    #: a worker's call takes the key alone, without parking (``lock_limit`` 1, a policy other
    #: than ``queue`` and ``replace``): the task's prepared acquire (see acquire_plan)
    mutex: bool = field(init=False)

    def __post_init__(self) -> None:
        mutex = self.limit == 1 and self.on_duplicate not in ("queue", "replace")
        object.__setattr__(self, "mutex", mutex)  # frozen: set once, here


def check_option_names(task_name: str, cls: type) -> None:
    """Refuse a lock-looking attribute of the task class ``cls`` that looks like a misspelt
    option.

    ``@app.task(base=LockedTask, lock_tll=5)`` makes ``lock_tll`` a class attribute that
    nothing reads: the task would run with the default TTL. Known names are those the classes
    of this package declare (``LockedTask``, the ``compat`` bases). In a class Celery built
    from ``@app.task`` options every attribute is an option, so every unknown lock-looking
    name is refused. A hand-written subclass also holds its own code and constants: a method
    or property is left alone, and so is a plain attribute unless its name is within a typo
    of an option (``lock_tll``; not ``lock_prefix_doc``): refusing every ``lock_*`` name
    would forbid users names of their own for no safety gained.

    Raises:
        LockConfigurationError: naming the task, each unknown option and the closest known one.
    """
    known: dict[str, bool] = {}  # name -> is an option (not code)
    for klass in cls.__mro__:
        if klass.__module__.startswith(_OURS):
            for name, value in vars(klass).items():
                known.setdefault(
                    name, LOCK_OPTION_NAME.match(name) is not None and not _is_code(value)
                )
    options = sorted(name for name, is_option in known.items() if is_option)
    unknown: list[str] = []
    for klass in cls.__mro__:
        if klass.__module__.startswith(_OURS) or klass is object:
            continue
        from_options = bool(vars(klass).get("_decorated"))  # built by @app.task from options
        unknown += [
            name
            for name, value in vars(klass).items()
            if LOCK_OPTION_NAME.match(name)
            and name not in known
            and name not in unknown
            and (from_options or (not _is_code(value) and _closest(name, options) is not None))
        ]
    if unknown:
        raise LockConfigurationError(
            f"task {task_name}: unknown option(s) "
            + ", ".join(suggest(name, options) for name in sorted(unknown))
            + f"; the task options are listed in {LISTED_IN}"
        )


def _is_code(value: Any) -> bool:
    return inspect.isroutine(value) or isinstance(value, (property, classmethod, staticmethod))


def _closest(name: str, known: list[str], cutoff: float = 0.8) -> Optional[str]:
    """The one of ``known`` that ``name`` is a likely typo of (difflib's ratio >= ``cutoff``)."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=cutoff)
    return close[0] if close else None


def suggest(name: str, known: list[str]) -> str:
    """``name``, with the closest of ``known`` if one is close (for a misspelt name)."""
    close = _closest(name, known, cutoff=0.6)
    return f"{name} (did you mean {close}?)" if close else name


def _number(task: str, name: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise LockConfigurationError(
            f"task {task}: {name} must be a number of seconds, got {value!r}"
        )
    if not low <= value <= high:
        raise LockConfigurationError(
            f"task {task}: {name}={value!r} is out of range; use {low} to {high} seconds"
        )
    return float(value)


def queued_seconds(task: str, name: str, value: Any) -> float:
    """``value`` validated as the seconds a queued marker lives (option or setting ``name``)."""
    return _number(task, name, value, 1.0, 7 * MAX_TTL)


def _choice(task: str, name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise LockConfigurationError(
            f"task {task}: {name}={value!r} is not one of {', '.join(map(repr, allowed))}"
        )
    return str(value)


def _check_results_stored(
    task: str, attributes: Mapping[str, Any], conf: Mapping[str, Any]
) -> None:
    """A ``join`` duplicate ends with the outcome its holder stored: the task's results must be
    stored (``ignore_result`` is resolved from ``task_ignore_result`` by Celery's ``bind``)."""
    if attributes.get("ignore_result"):
        raise LockConfigurationError(
            f"task {task}: on_duplicate='join' needs the task's results, but it has "
            "ignore_result=True; set ignore_result=False or choose another on_duplicate"
        )
    if celery_setting(conf, "result_backend") in (None, "", "disabled"):
        raise LockConfigurationError(
            f"task {task}: on_duplicate='join' needs a result backend to read the running "
            "execution's outcome from; set the app's result_backend or choose another "
            "on_duplicate"
        )


def _check_queue(task: str, dedupe: bool, finished_ttl: Optional[float]) -> None:
    """``queue`` runs every duplicate: it cannot also drop them at enqueue, and it needs the
    finish record that keeps a hand-off sent twice from running twice."""
    if dedupe:
        raise LockConfigurationError(
            f"task {task}: on_duplicate='queue' runs every duplicate, one after the other, but "
            "dedupe_on_enqueue=True drops them before they are queued; choose one of the two"
        )
    if finished_ttl is None:
        raise LockConfigurationError(
            f"task {task}: on_duplicate='queue' needs lock_finished_ttl (it keeps a parked "
            "message that was handed the lock twice from running twice); set it to a number "
            "of seconds (default 3600) or choose another on_duplicate"
        )


def handoff_settings(conf: Mapping[str, Any]) -> tuple[float, float]:
    """The sweep interval and the reservation TTL of policy ``queue``, validated.

    Raises:
        LockConfigurationError: naming the setting.
    """
    values = []
    for setting, low, high in (
        ("singleton_lock_handoff_sweep_interval", 0.05, 3600.0),
        ("singleton_lock_handoff_timeout", 1.0, MAX_TTL),
    ):
        value = conf.get(setting)
        value = APP_SETTINGS[setting].default if value is None else value
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not (low <= value <= high)
        ):
            raise LockConfigurationError(
                f"{setting} must be a number of seconds from {low} to {high}, got {value!r}"
            )
        values.append(float(value))
    return values[0], values[1]


def celery_setting(conf: Mapping[str, Any], name: str) -> Any:
    """A Celery setting as Celery reads it: ``broker_url``, ``broker_write_url`` and
    ``result_backend`` also come from ``$CELERY_BROKER_URL``, ``$CELERY_BROKER_WRITE_URL`` and
    ``$CELERY_RESULT_BACKEND`` (what ``celery -b`` and ``--result-backend`` set), which their
    properties read and ``conf.get()`` does not."""
    return getattr(conf, name, None) or conf.get(name)


def lock_prefix(conf: Mapping[str, Any]) -> Any:
    """The configured key prefix (validated by the caller); the default when unset."""
    prefix = conf.get("singleton_lock_prefix")
    return APP_SETTINGS["singleton_lock_prefix"].default if prefix is None else prefix


def unknown_settings(conf: Mapping[str, Any]) -> list[str]:
    """``singleton_lock_*`` keys in ``conf`` that this package does not know (typos); those
    of celery-singleton are not ours to judge (:data:`CELERY_SINGLETON_SETTINGS`)."""
    return sorted(
        key
        for key in conf
        if key.startswith("singleton_lock_")
        and key not in KNOWN_SETTINGS
        and key not in CELERY_SINGLETON_SETTINGS
    )


def resolve(
    *,
    task_name: str,
    func: Callable[..., Any],
    skip_first: bool,
    attributes: Mapping[str, Any],
    conf: Mapping[str, Any],
    time_limit: Optional[float] = None,
) -> LockOptions:
    """Resolve and validate a task's options.

    Args:
        attributes: the task's attributes (``lock_ttl``...); ``UNSET`` defers to ``conf``.
        conf: the app's configuration.
        time_limit: the task's own hard time limit, if it has one.

    Raises:
        LockConfigurationError: naming the task, the option and what to do.
    """
    value: dict[str, Any] = {}
    for attribute, option in TASK_OPTIONS.items():
        chosen = attributes.get(attribute, UNSET)
        if chosen is UNSET:
            chosen = conf.get(option.setting, option.default)
        value[attribute] = chosen

    ttl = _number(task_name, "lock_ttl", value["lock_ttl"], MIN_TTL, MAX_TTL)
    backoff = _number(task_name, "lock_retry_backoff", value["lock_retry_backoff"], 0.001, MAX_TTL)
    backoff_max = _number(
        task_name, "lock_retry_backoff_max", value["lock_retry_backoff_max"], backoff, MAX_TTL
    )
    wait_timeout = _number(task_name, "lock_wait_timeout", value["lock_wait_timeout"], 0.0, 3600)
    min_replicas = value["lock_min_replicas"]
    if isinstance(min_replicas, bool) or not isinstance(min_replicas, int) or min_replicas < 0:
        raise LockConfigurationError(
            f"task {task_name}: lock_min_replicas must be an integer >= 0 (0: do not wait for "
            f"replicas), got {min_replicas!r}"
        )
    replicas_timeout = _number(
        task_name, "lock_min_replicas_timeout", value["lock_min_replicas_timeout"], 0.001, 60.0
    )
    finished_ttl = value["lock_finished_ttl"]
    if finished_ttl is not None:
        finished_ttl = _number(task_name, "lock_finished_ttl", finished_ttl, MIN_TTL, 7 * MAX_TTL)
    max_retries = value["lock_max_retries"]
    if max_retries is not None and (
        isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0
    ):
        raise LockConfigurationError(
            f"task {task_name}: lock_max_retries must be None (retry until acquired) or an "
            f"integer >= 0, got {max_retries!r}"
        )
    fencing = value["lock_fencing"]
    if not isinstance(fencing, bool):
        raise LockConfigurationError(
            f"task {task_name}: lock_fencing must be True or False, got {fencing!r}"
        )
    dedupe = value["dedupe_on_enqueue"]
    if not isinstance(dedupe, bool):
        raise LockConfigurationError(
            f"task {task_name}: dedupe_on_enqueue must be True or False, got {dedupe!r}"
        )
    queued_ttl = queued_seconds(task_name, "lock_queued_ttl", value["lock_queued_ttl"])
    # fences, replicas, markers, parking: refused here on a quorum (the settings name it)
    refuse_unsupported(task_name, value, capabilities_from_settings(conf))
    prefix = lock_prefix(conf)
    try:
        validate_prefix(prefix)
        LockKeys.build(prefix, f"{task_name}:{'0' * 64}")
    except LockConfigurationError as exc:
        raise LockConfigurationError(f"task {task_name}: {exc.message}") from None

    on_duplicate = _choice(task_name, "on_duplicate", value["on_duplicate"], POLICIES)
    limit = checked_limit(task_name, value["lock_limit"], value)  # before join's own checks
    rate = checked_rate(task_name, value["lock_rate"], value)
    cooldown, cooldown_after = checked_cooldown(
        task_name, value["lock_cooldown"], value["lock_cooldown_after"], on_duplicate
    )
    if on_duplicate == "join":
        _check_results_stored(task_name, attributes, conf)
    if on_duplicate == "queue":
        _check_queue(task_name, dedupe, finished_ttl)
    debounce, debounce_max = check_latest_wins(
        task_name, on_duplicate, value, dedupe=dedupe, finished_ttl=finished_ttl
    )
    _, handoff_timeout = handoff_settings(conf)

    return LockOptions(
        task_name=task_name,
        keyer=ArgumentKeyer(
            task_name,
            func,
            lock_on=attributes.get("lock_on"),
            lock_key=attributes.get("lock_key"),
            skip_first=skip_first,
        ),
        prefix=prefix,
        ttl=ttl,
        on_duplicate=on_duplicate,
        fencing=fencing,
        retry_backoff=backoff,
        retry_backoff_max=backoff_max,
        max_retries=max_retries,
        wait_timeout=wait_timeout,
        on_backend_error=_choice(
            task_name,
            "lock_on_backend_error",
            value["lock_on_backend_error"],
            BACKEND_ERROR_POLICIES,
        ),
        finished_ttl=finished_ttl,
        min_replicas=min_replicas,
        min_replicas_timeout=replicas_timeout,
        default_time_limit=time_limit or conf.get("task_time_limit") or None,
        dedupe_on_enqueue=dedupe,
        queued_ttl=queued_ttl,
        handoff_timeout=handoff_timeout,
        debounce=debounce,
        debounce_max=debounce_max,
        limit=limit,
        cooldown=cooldown,
        cooldown_after=cooldown_after,
        rate=rate,
    )
