"""Task options a lock backend cannot honour, refused from its capabilities.

Each backend says what it supports in a :class:`~celery_singleton_lock.engine.Capabilities`
record. An option that needs an unsupported feature is refused, naming the task, the option
and why: when the task is registered, from what the settings alone say (a Redlock quorum is
named by ``singleton_lock_url``), and again when the worker starts, from the backend itself
(a Redis Cluster may only be known once the server is asked). Add an entry to :data:`NEEDS`
for any new option that needs a feature some backend lacks.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from celery_singleton_lock.celery.config.urls import is_postgres, quorum_urls
from celery_singleton_lock.celery.duplicates.policies import POLICIES
from celery_singleton_lock.engine import POSTGRES, QUORUM, Capabilities
from celery_singleton_lock.errors import LockConfigurationError


def _policy_needs(policy: Any) -> tuple[str, ...]:
    chosen = POLICIES.get(policy)
    return () if chosen is None else chosen.needs


#: option -> (the capabilities a value needs, whether a resolved value asks for any, its
#: attribute of the resolved ``LockOptions``)
NEEDS: dict[str, tuple[Callable[[Any], tuple[str, ...]], Callable[[Any], bool], str]] = {
    "lock_fencing": (lambda _: ("fencing",), bool, "fencing"),
    "dedupe_on_enqueue": (lambda _: ("enqueue_markers",), bool, "dedupe_on_enqueue"),
    "lock_min_replicas": (lambda _: ("replica_acks",), bool, "min_replicas"),
    "on_duplicate": (_policy_needs, lambda policy: bool(_policy_needs(policy)), "on_duplicate"),
    "lock_limit": (lambda _: ("slots",), lambda limit: limit != 1, "limit"),
    "lock_cooldown": (lambda _: ("cooldown",), bool, "cooldown"),
    "lock_rate": (lambda _: ("rate",), lambda rate: rate is not None, "rate"),
}

#: options that, beside a parking policy, need ``parking_slots`` (calls parked behind several
#: slots, a rate or a cooldown)
PARKED_BEHIND = ("lock_limit", "lock_rate", "lock_cooldown")

#: what names the backend in the settings, said after its kind in a refusal
_NAMED_BY = {
    QUORUM: " (singleton_lock_url lists several servers)",
    POSTGRES: " (singleton_lock_url is a postgresql:// URL)",
}


def capabilities_from_settings(conf: Mapping[str, Any]) -> Optional[Capabilities]:
    """The capabilities the settings alone decide, without asking a server: a quorum's,
    PostgreSQL's; None when the backend must be asked (one server, Sentinel or Cluster)."""
    url = conf.get("singleton_lock_url")
    if is_postgres(url):
        return POSTGRES
    return QUORUM if quorum_urls(url) is not None else None


def refuse_unsupported(
    task_name: str, values: Mapping[str, Any], capabilities: Optional[Capabilities]
) -> None:
    """Raise for an option in ``values`` (resolved task options) that a backend of
    ``capabilities`` cannot honour (nothing when ``capabilities`` is None: not known yet).

    Raises:
        LockConfigurationError: naming the task, the option, the backend and why.
    """
    if capabilities is None:
        return
    for option, (features, asks, _) in NEEDS.items():
        if option not in values:  # not asked (``requested`` leaves out what is not)
            continue
        value = values[option]
        missing = [f for f in features(value) if not getattr(capabilities, f)]
        if asks(value) and missing:
            raise _refusal(task_name, f"{option}={value!r}", capabilities, missing[0])
    if capabilities.parking_slots or not _asked(values, "on_duplicate"):
        return
    for option in PARKED_BEHIND:
        if _asked(values, option):
            what = f"on_duplicate={values['on_duplicate']!r} with {option}={values[option]!r}"
            raise _refusal(task_name, what, capabilities, "parking_slots")


def _asked(values: Mapping[str, Any], option: str) -> bool:
    """Whether ``values`` ask for ``option`` (a key of :data:`NEEDS`)."""
    return option in values and NEEDS[option][1](values[option])


def _refusal(
    task_name: str, what: str, capabilities: Capabilities, feature: str
) -> LockConfigurationError:
    return LockConfigurationError(
        f"task {task_name}: {what} is not supported on "
        f"{capabilities.kind}{_NAMED_BY.get(capabilities, '')}: "
        f"{capabilities.why_not(feature)}; turn it off, or "
        f"{capabilities.instead} for this app's locks"
    )


def requested(options: Any) -> dict[str, Any]:
    """The options of :data:`NEEDS` that resolved ``options`` (``LockOptions``) ask for."""
    values = {option: getattr(options, attribute) for option, (_, _, attribute) in NEEDS.items()}
    return {option: value for option, value in values.items() if NEEDS[option][1](value)}


def supports(capabilities: Capabilities, option: str, value: Any) -> bool:
    """Whether a backend of ``capabilities`` honours ``option`` (a key of :data:`NEEDS`) set
    to ``value``."""
    return all(getattr(capabilities, feature) for feature in NEEDS[option][0](value))
