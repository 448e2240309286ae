"""The lock options and settings, each declared once: app setting, default, allowed values and
meaning. The docs' options reference is generated from these declarations; a task's options are
resolved and checked from them in :mod:`.resolution`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Union

from celery_singleton_lock.errors import LockConfigurationError

#: Where a user reads the options and settings, for the errors that name an unknown one: the
#: docs page generated from this module (its source in the repository, its path on the site).
LISTED_IN = (
    "the Options and settings reference (docs/reference/options.md; reference/options/ on the "
    "docs site), generated from celery_singleton_lock.celery.config.options"
)

POLICIES = ("skip", "retry", "wait", "fail", "join", "queue", "replace", "restart")
BACKEND_ERROR_POLICIES = ("retry", "run")
#: ``dedupe_on_enqueue``'s values: off, on while a call is queued or running, or on only
#: while it is queued (a running call does not block the next one's publish)
UNTIL_STARTED = "until_started"
DEDUPE_CHOICES = (False, True, UNTIL_STARTED)

MIN_TTL, MAX_TTL = 0.1, 86_400.0


def checked_dedupe(task: str, value: Any) -> tuple[bool, bool]:
    """``dedupe_on_enqueue``'s ``value`` validated (one of :data:`DEDUPE_CHOICES`): whether
    it is on, and whether only a queued call, not a running one, is a duplicate.

    Raises:
        LockConfigurationError: naming the task, the option and its values.
    """
    if value is True or value is False:
        return value, False
    if value == UNTIL_STARTED:
        return True, True
    raise LockConfigurationError(
        f"task {task}: dedupe_on_enqueue must be True, False or {UNTIL_STARTED!r}, got {value!r}"
    )


@dataclass(frozen=True)
class Seconds:
    """The values a duration option allows: seconds from ``low`` to ``high``, or None too when
    ``optional``. Declared with the option, it is both the reference's "allowed" text
    (``str()``) and the check (:func:`seconds_of`): a range is written nowhere else."""

    low: float
    high: float
    optional: bool = False
    #: the low bound as the docs name it when a call passes another option's value as ``low``
    low_is: str = ""
    #: what the docs add after the range ("; needs on_duplicate='replace'")
    note: str = ""

    def __str__(self) -> str:
        low = self.low_is or f"{self.low:g}"
        none = "None or " if self.optional else ""
        return f"{none}{low} to {self.high:g} seconds{self.note}"

    def check(self, where: str, name: str, value: Any, low: Optional[float] = None) -> float:
        """``value`` (of ``name``, said of ``where``: "task proj.job", or "" for a setting)
        as seconds; None is the caller's to handle (:func:`seconds_of`)."""
        said = f"{where}: {name}" if where else name
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or (isinstance(value, float) and math.isnan(value))
        ):
            none = "None or " if self.optional else ""
            raise LockConfigurationError(f"{said} must be {none}a number of seconds, got {value!r}")
        bound = f"{self.low:g}" if low is None else f"{self.low_is or 'at least'} ({low:g})"
        low = self.low if low is None else low
        if not low <= value <= self.high:
            raise LockConfigurationError(
                f"{said}={value!r} is out of range; use {bound} to {self.high:g} seconds"
            )
        return float(value)


@dataclass(frozen=True)
class Count:
    """The values a count option allows: an integer >= ``low``, or None too when
    ``optional``; as :class:`Seconds`, both the reference's text and the check
    (:meth:`check`, :func:`count_of`)."""

    low: int
    optional: bool = False
    #: what the values mean, said in the error ("0: do not wait for replicas")
    means: str = ""
    #: what the docs add after the range (", or callable(**bound arguments) -> int")
    note: str = ""

    def __str__(self) -> str:
        return f"{'None or ' if self.optional else ''}an integer >= {self.low}{self.note}"

    def check(self, where: str, name: str, value: Any, verb: str = "must be") -> int:
        """``value`` (of ``name``, said of ``where`` as :meth:`Seconds.check` says it) as an
        integer >= ``low``; None is the caller's to handle (:func:`count_of`)."""
        if isinstance(value, bool) or not isinstance(value, int) or value < self.low:
            said = f"{where}: {name}" if where else name
            none = "None or " if self.optional else ""
            means = f" ({self.means})" if self.means else ""
            raise LockConfigurationError(
                f"{said} {verb} {none}an integer >= {self.low}{means}, got {value!r}"
            )
        return value


class Option(NamedTuple):
    """An option as users meet it; the docs' options reference is generated from these."""

    default: Any
    allowed: Union[str, Seconds, Count]
    meaning: str  #: one sentence


class TaskOption(NamedTuple):
    """A task option that falls back to an app setting (documented as :class:`Option` is)."""

    setting: str
    default: Any
    allowed: Union[str, Seconds, Count]
    meaning: str


#: task attribute -> its app setting, built-in default and documentation.
TASK_OPTIONS: dict[str, TaskOption] = {
    "lock_ttl": TaskOption(
        "singleton_lock_ttl",
        15.0,
        Seconds(MIN_TTL, MAX_TTL),
        "Seconds the lock lives unless renewed; renewed every third of that while the body "
        "runs, it bounds recovery after a crash, not the run time.",
    ),
    "on_duplicate": TaskOption(
        "singleton_lock_on_duplicate",
        "skip",
        ", ".join(map(repr, POLICIES)),
        "What a call does when another execution holds its lock.",
    ),
    "lock_fencing": TaskOption(
        "singleton_lock_fencing",
        False,
        "True or False",
        "Hand out a fencing token, strictly increasing per lock: self.request.lock.fence.",
    ),
    "lock_retry_backoff": TaskOption(
        "singleton_lock_retry_backoff",
        1.0,
        Seconds(0.001, MAX_TTL),
        "Base of a lock retry's exponential backoff (full jitter).",
    ),
    "lock_retry_backoff_max": TaskOption(
        "singleton_lock_retry_backoff_max",
        60.0,
        Seconds(0.001, MAX_TTL, low_is="lock_retry_backoff"),
        "Cap of a lock retry's backoff.",
    ),
    "lock_max_retries": TaskOption(
        "singleton_lock_max_retries",
        None,
        Count(0, optional=True, means="None: retry until the lock is taken"),
        "Lock-retry budget, apart from Celery's max_retries; None: until the lock is taken.",
    ),
    "lock_wait_timeout": TaskOption(
        "singleton_lock_wait_timeout",
        30.0,
        Seconds(0.0, 3600.0),
        "How long 'wait' and 'join' block a worker slot before falling back to a lock retry.",
    ),
    "lock_on_backend_error": TaskOption(
        "singleton_lock_on_backend_error",
        "retry",
        ", ".join(map(repr, BACKEND_ERROR_POLICIES)),
        "Lock server unreachable in before_start: send the task again later, or run unlocked.",
    ),
    "lock_finished_ttl": TaskOption(
        "singleton_lock_finished_ttl",
        3600.0,
        Seconds(MIN_TTL, 7 * MAX_TTL, optional=True),
        "acks_late and 'queue' tasks: how long a finished task id is remembered, so a copy of "
        "it delivered again is dropped; keep it >= the broker's visibility_timeout.",
    ),
    "lock_min_replicas": TaskOption(
        "singleton_lock_min_replicas",
        0,
        Count(0, means="0: do not wait for replicas"),
        "Replicas that must acknowledge the acquire (WAIT) before the body runs; fewer count "
        "as the lock server being unavailable.",
    ),
    "lock_min_replicas_timeout": TaskOption(
        "singleton_lock_min_replicas_timeout",
        1.0,
        Seconds(0.001, 60.0),
        "How long to wait for those acknowledgements.",
    ),
    "dedupe_on_enqueue": TaskOption(
        "singleton_lock_dedupe_on_enqueue",
        False,
        "True, False or 'until_started'",
        "apply_async() of a call queued or running publishes nothing, returns its AsyncResult; "
        "'until_started': only while that call is queued and not yet started, so a burst "
        "during a run yields one more run.",
    ),
    "lock_queued_ttl": TaskOption(
        "singleton_lock_queued_ttl",
        3600.0,
        Seconds(1.0, 7 * MAX_TTL),
        "dedupe_on_enqueue: how long a call whose message never reaches a worker blocks "
        "duplicates, counted from its countdown or eta.",
    ),
    "lock_debounce": TaskOption(
        "singleton_lock_debounce",
        None,
        Seconds(0.05, MAX_TTL, optional=True, note="; needs on_duplicate='replace'"),
        "Hold each call back this long (in Redis, not in a worker slot); a newer call of the "
        "same lock within it takes its place and starts it again: one run, newest arguments.",
    ),
    "lock_debounce_max": TaskOption(
        "singleton_lock_debounce_max",
        None,
        Seconds(0.05, MAX_TTL, optional=True, low_is="lock_debounce"),
        "With lock_debounce: a burst's waiting call is due at most this long after the "
        "burst's first call, however many newer calls keep coming; None: no bound.",
    ),
    "lock_cancel_grace": TaskOption(
        "singleton_lock_cancel_grace",
        5.0,
        Seconds(0.0, MAX_TTL, note="; needs on_duplicate='restart'"),
        "'restart' on a prefork worker: seconds a running call asked to stop has to end before "
        "its pool child is terminated (as revoke(terminate=True) does) and its lock freed; "
        "threads, gevent and solo pools only ask (the body reads self.request.lock.cancelled).",
    ),
    "lock_limit": TaskOption(
        "singleton_lock_limit",
        1,
        Count(
            1,
            means="at most that many bodies per lock key at once",
            note=", or callable(**bound arguments) -> int",
        ),
        "At most this many bodies per lock key at once, across all workers, each holding its "
        "own slot; a callable gives each call's cap (per tenant). With 'queue' a parked call "
        "takes the next freed slot in arrival order. Not with 'join' or 'replace'.",
    ),
    "lock_cooldown": TaskOption(
        "singleton_lock_cooldown",
        None,
        Seconds(0.0, MAX_TTL, optional=True),
        "After a body ends the key stays taken this long: a call inside it is a duplicate "
        "(reason 'cooldown'), a lock retry is sent for the cooldown's end, a waiting call "
        "('wait') starts then, a parked call "
        "('queue') is handed on when it ends. Not with 'join' or 'replace'.",
    ),
    "lock_cooldown_after": TaskOption(
        "singleton_lock_cooldown_after",
        "success",
        "'success' or 'always'",
        "Which ends start the cooldown: a success only, or any outcome (a failure too). A "
        "killed holder (its pool child or worker died) starts none, even with 'always': its "
        "lock is freed by the worker, or expires at its TTL.",
    ),
    "lock_rate": TaskOption(
        "singleton_lock_rate",
        None,
        "None or 'N/period': period s, m, h or a number of seconds ('10/30s')",
        "At most N body starts per key in any sliding window of that period, across all "
        "workers (server clock); over it a call is a duplicate (reason 'rate') and a lock "
        "retry is sent for when the window allows, a parked call ('queue') is handed on "
        "then. Not with 'join' or 'replace'.",
    ),
}

#: Task attributes with no app setting (LockedTask reads them itself).
TASK_ONLY_OPTIONS: dict[str, Option] = {
    "lock_on": Option(
        None,
        "names of the task's parameters, dotted paths into them ('order.customer_id'), or ()",
        "The parameters that identify the work; None: all, bound with defaults applied; (): "
        "none, one lock for every call of the task (or group).",
    ),
    "lock_group": Option(
        None,
        "None or a name without braces or whitespace",
        "Name the lock from this group instead of the task: the calls of every task of the "
        "group with equal lock_on arguments (by parameter name) share one lock, its "
        "lock_limit, lock_cooldown and lock_rate, which the group's tasks must declare alike "
        "(checked at worker start). Not with 'join' or 'replace'.",
    ),
    "lock_key": Option(
        None,
        "callable(*args, **kwargs) -> str",
        "Names the lock from the call's arguments, for full control; exclusive with lock_on.",
    ),
    "lock_fair_by": Option(
        None,
        "names of the task's parameters; with on_duplicate='queue'",
        "Calls parked behind a lock are handed it round robin across the values of these "
        "arguments (a tenant), by the message's priority (the broker's way) then oldest "
        "first within one; None: by priority, then in arrival order.",
    ),
}

#: App-wide settings with no task attribute. None of them turns the package on: an app is
#: served (worker bootstep, checks, threads, lock server) when it registers a LockedTask, and
#: left alone otherwise, whatever it sets (see celery/worker/wiring.py).
APP_SETTINGS: dict[str, Option] = {
    "singleton_lock_url": Option(
        None,
        "a redis://, rediss://, unix://, sentinel:// or postgresql:// URL, or a list of 3 or "
        "more Redis URLs",
        "The lock server (a list: a Redlock quorum; postgresql://: row leases in that "
        "database); None: the broker if it is Redis, else "
        "the result backend if it is Redis, else redis://localhost:6379/0.",
    ),
    "singleton_lock_prefix": Option(
        "singleton-lock",
        "letters, digits and _ . : - / | @ # = +",
        "Key namespace of the locks.",
    ),
    "singleton_lock_redis_options": Option(
        None,
        "a dict",
        "Extra keyword arguments of redis.Redis.from_url (timeouts, ssl_ca_certs...).",
    ),
    "singleton_lock_transport_options": Option(
        None,
        "a dict",
        "sentinel:// lock URL: master_name, sentinel_kwargs, min_other_sentinels, as Celery's "
        "broker_transport_options; None: the broker's, when its URL is used.",
    ),
    "singleton_lock_cluster": Option(
        None,
        "True, False or None",
        "True: the lock URL names a Redis Cluster node; False: one server; None: ask it.",
    ),
    "singleton_lock_handoff_timeout": Option(
        60.0,
        Seconds(1.0, MAX_TTL),
        "'queue': how long a lock handed to a parked call stays reserved for it while its "
        "message is on its way; a message lost meanwhile is sent again after that.",
    ),
    "singleton_lock_handoff_sweep_interval": Option(
        1.0,
        Seconds(0.05, 3600.0),
        "'queue': seconds between two looks, from each worker, for locks whose holder died "
        "(or whose reservation ran out) with calls parked behind them.",
    ),
    "singleton_lock_metrics": Option(
        False, "True or False", "Count lock decisions as Prometheus metrics (extra [metrics])."
    ),
    "singleton_lock_metrics_port": Option(
        None,
        "None or a TCP port",
        "With metrics on: the worker serves /metrics on this port; None: you serve them.",
    ),
    "singleton_lock_metrics_address": Option(
        "127.0.0.1", "an IP address", "The address the worker's /metrics port is bound to."
    ),
    "singleton_lock_metrics_dir": Option(
        None,
        "None or a directory path",
        "Where pool processes write their counts (emptied at worker start); None: "
        "$PROMETHEUS_MULTIPROC_DIR if set, else a fresh temporary directory.",
    ),
    "singleton_lock_trace_events": Option(
        True,
        "True or False",
        "With opentelemetry-api installed: add lock events to the span around the task.",
    ),
}

KNOWN_SETTINGS = frozenset(APP_SETTINGS) | {option.setting for option in TASK_OPTIONS.values()}

#: celery-singleton's settings (its ``Config``), which an app migrating from it, or using it
#: beside this package, carries: ``singleton_lock_expiry`` shares our ``singleton_lock_``
#: prefix but is not a misspelling of ours, and is never reported as one.
CELERY_SINGLETON_SETTINGS = frozenset(
    {
        "singleton_lock_expiry",
        "singleton_backend_url",
        "singleton_backend_class",
        "singleton_backend_kwargs",
        "singleton_key_prefix",
        "singleton_raise_on_duplicate",
        "singleton_json_encoder_class",
    }
)


class Unset:
    """Marks a task attribute left to the app setting (None is a meaningful value)."""

    def __repr__(self) -> str:
        return "<from app settings>"


UNSET: Any = Unset()


def seconds_of(
    where: str, name: str, value: Any, *, option: str = "", low: Optional[float] = None
) -> Optional[float]:
    """``value`` of the task option or app setting ``name``, checked against the
    :class:`Seconds` declared for it (for ``option``'s, when ``name`` is another name for its
    value, a compat setting say); ``low`` for a low bound that is another option's value.

    Raises:
        LockConfigurationError: naming ``where`` (see :meth:`Seconds.check`) and ``name``.
    """
    declared = (TASK_OPTIONS.get(option or name) or APP_SETTINGS[option or name]).allowed
    assert isinstance(declared, Seconds), f"{option or name} is not declared in seconds"
    if value is None and declared.optional:
        return None
    return declared.check(where, name, value, low)


def required_seconds_of(
    where: str, name: str, value: Any, *, option: str = "", low: Optional[float] = None
) -> float:
    """:func:`seconds_of` for an option that is never None."""
    seconds = seconds_of(where, name, value, option=option, low=low)
    assert seconds is not None, f"{option or name} is optional: use seconds_of"
    return seconds


def declared_count(name: str) -> Count:
    """The :class:`Count` declared for the task option ``name``."""
    declared = TASK_OPTIONS[name].allowed
    assert isinstance(declared, Count), f"{name} is not declared as a count"
    return declared


def count_of(where: str, name: str, value: Any) -> Optional[int]:
    """``value`` of the task option ``name``, checked against the :class:`Count` declared for
    it (None where it allows None).

    Raises:
        LockConfigurationError: naming ``where`` and ``name``.
    """
    declared = declared_count(name)
    if value is None and declared.optional:
        return None
    return declared.check(where, name, value)
