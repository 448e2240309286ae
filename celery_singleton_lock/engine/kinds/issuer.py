"""What every kind of lock on one server shares: the names of its keys, and the leases it
hands out (each refers to the backend that releases and renews it)."""

from __future__ import annotations

from typing import Callable, Optional

from celery_singleton_lock.engine.acquire_request import AcquireRequest
from celery_singleton_lock.engine.keys import LockKeys, SharedKeys
from celery_singleton_lock.engine.lease import Lease, LeaseKeeper, Owner
from celery_singleton_lock.engine.renewer import Renewer


class Issuer:
    """Key names under ``prefix`` and the leases of ``keeper`` (see the module docstring)."""

    def __init__(
        self,
        keeper: LeaseKeeper,
        prefix: str,
        shared: SharedKeys,
        renewer: Renewer,
        wall_clock: Callable[[], float],
        held: Optional[str] = None,
        markers: Optional[str] = None,
    ) -> None:
        self.keeper = keeper
        #: the held index key (keys.held_index) every script that takes, renews or releases a
        #: lock writes; None on a Redis Cluster, where no lock's script may write it
        self.held = held
        #: ``[held]``, or ``[]`` without it: the KEYS scripts append (see their contracts)
        self.held_keys: list[str] = [] if held is None else [held]
        #: ``[marker index]`` (keys.marker_index), or ``[]`` on a Redis Cluster
        self.marker_keys: list[str] = [] if markers is None else [markers]
        self.prefix = prefix
        self.shared = shared
        self.renewer = renewer
        self.wall_clock = wall_clock

    def keys(self, name: str) -> LockKeys:
        """Key names of the lock called ``name`` under this prefix."""
        return LockKeys.build(self.prefix, name)

    def lease(
        self,
        request: AcquireRequest,
        keys: LockKeys,
        token: str,
        owner: Owner,
        fence: Optional[int],
        sent_at: float,
        max_lifetime: Optional[float] = None,
        slot: int = 0,
    ) -> Lease:
        """The lease an acquire took, renewed from now if ``request`` asks; ``max_lifetime``:
        the call's, else the request's; ``slot``: the slot of the lock's slot table it holds
        (0: the lock key)."""
        if max_lifetime is None:
            max_lifetime = request.max_lifetime
        return Lease(
            locker=self.keeper,
            keys=keys,
            token=token,
            ttl=request.ttl,
            owner=owner,
            fence=fence,
            confirmed_at=sent_at,
            deadline=None if max_lifetime is None else sent_at + max_lifetime,
            on_lost=request.on_lost,
            renewer=self.renewer if request.renew else None,
            slot=slot,
        )
