"""Whether an app's locks live on a Redlock quorum, and the options a quorum refuses.

A quorum is named by ``singleton_lock_url`` given as a list or tuple of 3 or more plain Redis
URLs, or as one string of them separated by commas (the form ``--url`` takes). Only that
setting names one: a broker or backend URL list is a list of failover servers, not a quorum.

Options that cannot be made correct across independent masters are refused when the task is
registered and when the worker starts (:data:`REFUSED`): add an entry there for any new option
that needs one server (e.g. an ``on_duplicate`` policy that hands work over through Redis).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from celery_singleton_lock.errors import LockConfigurationError

#: Separator of the URLs of a quorum given as one string.
SEPARATOR = ","

#: option -> (is it asking for something a quorum cannot give, why), checked on resolved values
REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "lock_fencing": (
        bool,
        "a fencing token needs one counter, and a counter per independent master is not one: "
        "a master restarted without fsync'd persistence counts again from 0, and the next "
        "majority need not include the master that handed out the highest fence",
    ),
    "dedupe_on_enqueue": (
        bool,
        "the queued marker would live on one master, not on the quorum",
    ),
    "lock_min_replicas": (
        bool,
        "replica acknowledgement (WAIT) is a property of one master and its replicas",
    ),
    "on_duplicate": (
        lambda policy: policy == "queue",
        "parked messages and the index that hands them the lock live on one server",
    ),
}


def quorum_urls(url: Any) -> Optional[list[str]]:
    """The server URLs of a quorum named by ``url`` (a list, tuple or comma-separated string
    of URLs); None when ``url`` names one server (or a Sentinel group)."""
    if isinstance(url, (list, tuple)):
        return [str(part).strip() for part in url]
    if isinstance(url, str) and SEPARATOR in url:
        parts = [part.strip() for part in url.split(SEPARATOR)]
        if len(parts) > 1 and all("://" in part for part in parts):
            return parts
    return None


def as_url(url: Any) -> Any:
    """``url`` with a quorum's list joined into its one-string form (others unchanged)."""
    if isinstance(url, (list, tuple)):
        return SEPARATOR.join(str(part).strip() for part in url)
    return url


def uses_quorum(conf: Mapping[str, Any]) -> bool:
    """True when ``singleton_lock_url`` names a Redlock quorum."""
    return quorum_urls(conf.get("singleton_lock_url")) is not None


def refuse_on_quorum(task_name: str, values: Mapping[str, Any], conf: Mapping[str, Any]) -> None:
    """Raise for an option in ``values`` (resolved task options) that a quorum cannot honour.

    Raises:
        LockConfigurationError: naming the task, the option and why.
    """
    if not uses_quorum(conf):
        return
    for option, (asks, why) in REFUSED.items():
        value = values.get(option)
        if asks(value):
            raise LockConfigurationError(
                f"task {task_name}: {option}={value!r} is not supported with a Redlock quorum "
                f"(singleton_lock_url lists several servers): {why}; turn it off, or use one "
                "Redis server (or Sentinel / Cluster) for this app's locks"
            )
