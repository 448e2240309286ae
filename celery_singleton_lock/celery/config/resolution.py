"""A task's lock options resolved and checked: task attribute, else app setting
``singleton_lock_<name>``, else the default declared in :mod:`.options`; every value checked
at registration (and again at worker start for settings changed since), each error naming the
task and the option."""

from __future__ import annotations

import difflib
import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from celery_singleton_lock.arguments import ArgumentKeyer

# handoff_settings and lock_prefix are read from here too (the CLI, the worker's checks)
from celery_singleton_lock.celery.config.app_settings import SEND_WINDOW
from celery_singleton_lock.celery.config.app_settings import handoff_settings as handoff_settings
from celery_singleton_lock.celery.config.app_settings import lock_prefix as lock_prefix
from celery_singleton_lock.celery.config.backend_support import (
    capabilities_from_settings,
    refuse_unsupported,
)
from celery_singleton_lock.celery.config.groups import checked_group
from celery_singleton_lock.celery.config.latest_wins import check_latest_wins, checked_cancel_grace
from celery_singleton_lock.celery.config.limits import (
    checked_cooldown,
    checked_limit,
    checked_rate,
)
from celery_singleton_lock.celery.config.options import (
    BACKEND_ERROR_POLICIES,
    CELERY_SINGLETON_SETTINGS,
    KNOWN_SETTINGS,
    LISTED_IN,
    TASK_OPTIONS,
    UNSET,
    checked_dedupe,
    count_of,
    declared_count,
    required_seconds_of,
    seconds_of,
)
from celery_singleton_lock.celery.duplicates.policies import POLICIES, DuplicatePolicy
from celery_singleton_lock.engine import LockKeys, cap_key, validate_prefix
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
    #: the ``on_duplicate`` policy, chosen once here: the task asks it, never its name
    policy: DuplicatePolicy
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
    #: ``dedupe_on_enqueue='until_started'``: only a queued call blocks the next one's publish
    #: (a running one does not), and a call that will run later stays queued meanwhile
    dedupe_until_started: bool = False
    #: seconds a queued marker lives when its message never reaches a worker (purged, lost)
    queued_ttl: float = 3600.0
    #: policy ``queue``: seconds a lock handed to a parked message stays reserved for it
    handoff_timeout: float = 60.0
    #: policy ``replace``: seconds each call is held back, and the bound of a burst (None:
    #: no debounce; no bound)
    debounce: Optional[float] = None
    debounce_max: Optional[float] = None
    #: policy ``restart``: seconds a running call asked to stop has before a prefork worker
    #: terminates its pool child
    cancel_grace: float = 5.0
    #: at most this many holders per key (an int >= 1, or a callable of the bound arguments)
    limit: Any = 1
    #: ``lock_fair_by``: names a call's fairness value from its arguments (None: parked calls
    #: go in arrival order)
    fair_keyer: Optional[ArgumentKeyer] = None
    #: seconds the key stays taken after a body ends (None: not at all), and after which ends
    cooldown: Optional[float] = None
    cooldown_after: str = "success"
    #: at most ``rate[0]`` body starts per key in any ``rate[1]`` seconds, or None
    rate: Optional[tuple[int, float]] = None
    #: the key of the live rule of the task's (or group's) locks, read by every acquire on one
    #: server or Sentinel: its cap (``celery locks limit``, for a ``lock_limit`` above 1 or
    #: callable) and its pause (``celery locks pause``, ``self.request.lock.pause_for``)
    cap_key: str = ""
    #: which way a message's ``priority`` reads on the app's broker, for the calls parked
    #: (policy ``queue``; with ``lock_fair_by``, within a value): 1, higher first (RabbitMQ and
    #: the other AMQP brokers); -1, lower first (kombu's Redis transport: 0 is the highest)
    priority_sign: int = 1
    #: a worker's call asks what every call of the task asks, but for its name, owner and time
    #: limit (a static ``lock_limit``, a policy other than ``queue`` and ``replace``, which
    #: park the call): it goes through the task's prepared acquire (see execution.prepared)
    prepared: bool = field(init=False)
    #: every call's lock lives in its slot table (engine/slots.py), whatever the call's limit:
    #: a ``lock_limit`` other than the static 1 (a callable one too), a rate, or a policy
    #: that parks behind the slots (``queue``); else its lock key. Chosen once, here, so that
    #: the calls of one task never look for each other in two places
    slotted: bool = field(init=False)

    def __post_init__(self) -> None:
        prepared = type(self.limit) is int and not self.policy.parks
        object.__setattr__(self, "prepared", prepared)  # frozen: set once, here
        one = type(self.limit) is int and self.limit == 1
        slotted = not one or self.rate is not None or self.policy.parks_behind_slots
        object.__setattr__(self, "slotted", slotted)

    def priority_rank(self, priority: Optional[int]) -> int:
        """The rank of a call whose message has ``priority`` among the calls parked in
        arrival order: read the broker's way (higher: handed a slot sooner); 0 without one."""
        return 0 if priority is None else priority * self.priority_sign

    def fair_value(self, args: Any, kwargs: Any) -> str:
        """The fairness value of a call with ``args`` and ``kwargs`` ("" without
        ``lock_fair_by``)."""
        keyer = self.fair_keyer
        return "" if keyer is None else keyer.name(tuple(args or ()), dict(kwargs or {}))

    @property
    def send_window(self) -> float:
        """Seconds a slot handed to a parked call stays reserved until its message is
        published (see :data:`SEND_WINDOW`)."""
        return min(SEND_WINDOW, self.handoff_timeout)

    @property
    def on_duplicate(self) -> str:
        """The name of the task's ``on_duplicate`` policy (as set)."""
        return self.policy.name


def _cap_key(prefix: str, keyer: ArgumentKeyer) -> str:
    """The key of the live rule of the task's (or group's) locks: a cap, which lowers a
    declared limit of several slots, and a pause, which stops every start (engine
    live_rules.py)."""
    return cap_key(prefix, f"{keyer.namespace}{keyer.head}")


#: kombu transports that read a message's priority lower first (0 is the highest): Redis's
REDIS_TRANSPORTS = ("redis", "rediss", "sentinel", "redis+socket")


def _priority_sign(conf: Mapping[str, Any]) -> int:
    """Which way the app's broker reads a message's priority (see ``priority_sign``)."""
    url = conf.get("broker_url") or ""
    if isinstance(url, (list, tuple)):
        url = url[0] if url else ""
    scheme = str(url).split("://", 1)[0].split(";", 1)[0].lower() if "://" in str(url) else ""
    return -1 if scheme in REDIS_TRANSPORTS else 1


def _fair_keyer(
    task_name: str,
    func: Callable[..., Any],
    skip_first: bool,
    keyer: ArgumentKeyer,
    policy: DuplicatePolicy,
    attributes: Mapping[str, Any],
) -> Optional[ArgumentKeyer]:
    """``lock_fair_by`` checked, as the keyer of a call's fairness value (None if unset)."""
    fair_by = attributes.get("lock_fair_by")
    if fair_by is None:
        return None
    if isinstance(fair_by, str):
        fair_by = (fair_by,)
    if not isinstance(fair_by, (tuple, list)) or not fair_by:
        raise LockConfigurationError(
            f"task {task_name}: lock_fair_by must name one or more of the task's parameters "
            f"(a tuple of names, e.g. ('tenant',)), got {fair_by!r}"
        )
    if not policy.orders_parked:
        raise LockConfigurationError(
            f"task {task_name}: lock_fair_by orders the calls parked by on_duplicate='queue'; "
            f"with on_duplicate={policy.name!r} none are (set on_duplicate='queue', or remove "
            "lock_fair_by)"
        )
    parameters = list(keyer.signature.parameters)
    missing = [name for name in fair_by if name not in parameters]
    if missing:
        raise LockConfigurationError(
            f"task {task_name}: lock_fair_by names {missing}, which the task does not take "
            f"(its parameters: {parameters}); name the arguments to be fair across"
        )
    return ArgumentKeyer(task_name, func, lock_on=tuple(fair_by), skip_first=skip_first)


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


def queued_seconds(task: str, name: str, value: Any) -> float:
    """``value`` validated as the seconds a queued marker lives (option or setting ``name``:
    ``lock_queued_ttl``'s, or another name for it)."""
    return required_seconds_of(f"task {task}", name, value, option="lock_queued_ttl")


def _choice(task: str, name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise LockConfigurationError(
            f"task {task}: {name}={value!r} is not one of {', '.join(map(repr, allowed))}"
        )
    return str(value)


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

    task = f"task {task_name}"
    ttl = required_seconds_of(task, "lock_ttl", value["lock_ttl"])
    backoff = required_seconds_of(task, "lock_retry_backoff", value["lock_retry_backoff"])
    backoff_max = required_seconds_of(
        task, "lock_retry_backoff_max", value["lock_retry_backoff_max"], low=backoff
    )
    wait_timeout = required_seconds_of(task, "lock_wait_timeout", value["lock_wait_timeout"])
    min_replicas = declared_count("lock_min_replicas").check(
        task, "lock_min_replicas", value["lock_min_replicas"]
    )
    replicas_timeout = required_seconds_of(
        task, "lock_min_replicas_timeout", value["lock_min_replicas_timeout"]
    )
    finished_ttl = seconds_of(task, "lock_finished_ttl", value["lock_finished_ttl"])
    max_retries = count_of(task, "lock_max_retries", value["lock_max_retries"])
    fencing = value["lock_fencing"]
    if not isinstance(fencing, bool):
        raise LockConfigurationError(
            f"task {task_name}: lock_fencing must be True or False, got {fencing!r}"
        )
    dedupe, until_started = checked_dedupe(task_name, value["dedupe_on_enqueue"])
    queued_ttl = queued_seconds(task_name, "lock_queued_ttl", value["lock_queued_ttl"])
    # fences, replicas, markers, parking: refused here on a quorum (the settings name it)
    refuse_unsupported(task_name, value, capabilities_from_settings(conf))
    prefix = lock_prefix(conf)
    try:
        validate_prefix(prefix)
        LockKeys.build(prefix, f"{task_name}:{'0' * 64}")
    except LockConfigurationError as exc:
        raise LockConfigurationError(f"task {task_name}: {exc.message}") from None

    policy = POLICIES[_choice(task_name, "on_duplicate", value["on_duplicate"], tuple(POLICIES))]()
    limit = checked_limit(task_name, value["lock_limit"], value)  # before the policy's checks
    rate = checked_rate(task_name, value["lock_rate"], value)
    cooldown, cooldown_after = checked_cooldown(
        task_name, value["lock_cooldown"], value["lock_cooldown_after"], policy.name
    )
    debounce, debounce_max = check_latest_wins(task_name, policy, value)
    cancel_grace = checked_cancel_grace(task_name, policy, attributes, value, conf)
    policy.check(task_name, {**value, "ignore_result": attributes.get("ignore_result")}, conf)
    group = checked_group(task_name, attributes.get("lock_group"), prefix, policy)
    _, handoff_timeout = handoff_settings(conf)
    keyer = ArgumentKeyer(
        task_name,
        func,
        lock_on=attributes.get("lock_on"),
        lock_key=attributes.get("lock_key"),
        skip_first=skip_first,
        group=group,
    )

    return LockOptions(
        task_name=task_name,
        keyer=keyer,
        fair_keyer=_fair_keyer(task_name, func, skip_first, keyer, policy, attributes),
        prefix=prefix,
        ttl=ttl,
        policy=policy,
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
        dedupe_until_started=until_started,
        queued_ttl=queued_ttl,
        handoff_timeout=handoff_timeout,
        debounce=debounce,
        debounce_max=debounce_max,
        cancel_grace=cancel_grace,
        limit=limit,
        cooldown=cooldown,
        cooldown_after=cooldown_after,
        rate=rate,
        cap_key=_cap_key(prefix, keyer),
        priority_sign=_priority_sign(conf),
    )
