"""What a backend supports (:class:`Capabilities`), read by the Celery layer to refuse an
option at registration and at worker start rather than find out at run time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Capabilities:
    """What a backend supports, for the Celery layer to refuse options it cannot honour.

    Each ``False`` feature has its reason in ``why_not`` (said to the user with the task and
    the option).
    """

    #: fencing tokens, strictly increasing per lock name (``lock_fencing``)
    fencing: bool
    #: waiting for replicas to acknowledge an acquire (``lock_min_replicas``)
    replica_acks: bool
    #: parking duplicates behind a held lock and handing it on (``on_duplicate='queue'``)
    parking: bool
    #: queued markers of deduplication at enqueue (``dedupe_on_enqueue``)
    enqueue_markers: bool
    #: a Redis Cluster (scripts per slot, renewal per node)
    cluster: bool
    #: what the backend is, for people: "a Redlock quorum of independent Redis servers"...
    kind: str
    #: ``(feature, why it is not supported)`` for each unsupported feature
    reasons: tuple[tuple[str, str], ...] = ()
    #: what to use instead for an unsupported feature, for people
    instead: str = ""
    #: up to N holders per lock name (``lock_limit`` > 1, see :mod:`.slots`)
    slots: bool = True
    #: a release that leaves the key taken for a while (``lock_cooldown``, :mod:`.cooldown`)
    cooldown: bool = True
    #: at most N acquisitions per sliding window (``lock_rate``, :mod:`.slots`)
    rate: bool = True
    #: parking behind several slots, a rate or a cooldown (``on_duplicate='queue'`` with
    #: ``lock_limit`` > 1, ``lock_rate`` or ``lock_cooldown``, :mod:`.kinds.slot_queue`)
    parking_slots: bool = True

    def why_not(self, feature: str) -> str:
        """Why ``feature`` (a field name above) is not supported here ("" if it is)."""
        return dict(self.reasons).get(feature, "")
