"""The lock options and settings, each declared once: app setting, default, allowed values and
meaning. The docs' options reference is generated from these declarations; a task's options are
resolved and checked from them in :mod:`.resolution`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

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


class Option(NamedTuple):
    """An option as users meet it; the docs' options reference is generated from these."""

    default: Any
    allowed: str
    meaning: str  #: one sentence


class TaskOption(NamedTuple):
    """A task option that falls back to an app setting (documented as :class:`Option` is)."""

    setting: str
    default: Any
    allowed: str
    meaning: str


#: task attribute -> its app setting, built-in default and documentation.
TASK_OPTIONS: dict[str, TaskOption] = {
    "lock_ttl": TaskOption(
        "singleton_lock_ttl",
        15.0,
        f"{MIN_TTL:g} to {MAX_TTL:g} seconds",
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
        f"0.001 to {MAX_TTL:g} seconds",
        "Base of a lock retry's exponential backoff (full jitter).",
    ),
    "lock_retry_backoff_max": TaskOption(
        "singleton_lock_retry_backoff_max",
        60.0,
        f"lock_retry_backoff to {MAX_TTL:g} seconds",
        "Cap of a lock retry's backoff.",
    ),
    "lock_max_retries": TaskOption(
        "singleton_lock_max_retries",
        None,
        "None or an integer >= 0",
        "Lock-retry budget, apart from Celery's max_retries; None: until the lock is taken.",
    ),
    "lock_wait_timeout": TaskOption(
        "singleton_lock_wait_timeout",
        30.0,
        "0 to 3600 seconds",
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
        f"None or {MIN_TTL:g} to {7 * MAX_TTL:g} seconds",
        "acks_late and 'queue' tasks: how long a finished task id is remembered, so a copy of "
        "it delivered again is dropped; keep it >= the broker's visibility_timeout.",
    ),
    "lock_min_replicas": TaskOption(
        "singleton_lock_min_replicas",
        0,
        "an integer >= 0",
        "Replicas that must acknowledge the acquire (WAIT) before the body runs; fewer count "
        "as the lock server being unavailable.",
    ),
    "lock_min_replicas_timeout": TaskOption(
        "singleton_lock_min_replicas_timeout",
        1.0,
        "0.001 to 60 seconds",
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
        f"1 to {7 * MAX_TTL:g} seconds",
        "dedupe_on_enqueue: how long a call whose message never reaches a worker blocks "
        "duplicates, counted from its countdown or eta.",
    ),
    "lock_debounce": TaskOption(
        "singleton_lock_debounce",
        None,
        f"None or 0.05 to {MAX_TTL:g} seconds; needs on_duplicate='replace'",
        "Hold each call back this long (in Redis, not in a worker slot); a newer call of the "
        "same lock within it takes its place and starts it again: one run, newest arguments.",
    ),
    "lock_debounce_max": TaskOption(
        "singleton_lock_debounce_max",
        None,
        f"None or lock_debounce to {MAX_TTL:g} seconds",
        "With lock_debounce: a burst's waiting call is due at most this long after the "
        "burst's first call, however many newer calls keep coming; None: no bound.",
    ),
    "lock_cancel_grace": TaskOption(
        "singleton_lock_cancel_grace",
        5.0,
        f"0 to {MAX_TTL:g} seconds; needs on_duplicate='restart'",
        "'restart' on a prefork worker: seconds a running call asked to stop has to end before "
        "its pool child is terminated (as revoke(terminate=True) does) and its lock freed; "
        "threads, gevent and solo pools only ask (the body reads self.request.lock.cancelled).",
    ),
    "lock_limit": TaskOption(
        "singleton_lock_limit",
        1,
        "an integer >= 1, or callable(**bound arguments) -> int",
        "At most this many bodies per lock key at once, across all workers, each holding its "
        "own slot; a callable gives each call's cap (per tenant). With 'queue' a parked call "
        "takes the next freed slot in arrival order. Not with 'join' or 'replace'.",
    ),
    "lock_cooldown": TaskOption(
        "singleton_lock_cooldown",
        None,
        f"None or 0 to {MAX_TTL:g} seconds",
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
        f"1 to {MAX_TTL:g} seconds",
        "'queue': how long a lock handed to a parked call stays reserved for it while its "
        "message is on its way; a message lost meanwhile is sent again after that.",
    ),
    "singleton_lock_handoff_sweep_interval": Option(
        1.0,
        "0.05 to 3600 seconds",
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
