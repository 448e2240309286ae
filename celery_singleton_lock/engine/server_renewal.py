"""Renewal on one server: a batch of leases by their tokens (the pool's renewer thread, one
round trip per tick for every lease of the process), and the locks of a supervisor's children
by their owner fields (the worker's main process, which knows no child's token). Beside the
renewer (:mod:`.renewer`), which calls it through the backend of each lease.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from redis.commands.core import Script

from celery_singleton_lock.engine import slots
from celery_singleton_lock.engine.kinds.issuer import Issuer
from celery_singleton_lock.engine.lease import Lease, Owner
from celery_singleton_lock.engine.lua_scripts import source
from celery_singleton_lock.engine.redis_server import RedisServer
from celery_singleton_lock.engine.script_calls import _ms


class ServerRenewal:
    """The renewals on ``server``, by token and by owner."""

    def __init__(self, server: RedisServer, issuer: Issuer) -> None:
        self.server = server
        self.issuer = issuer
        self._renew: Script = server.register(source("renew"))
        self._renew_by_owner: Script = server.register(source("renew_by_owner"))

    def renew_batch(self, leases: Sequence[Lease], *, now: float) -> list[int]:
        """Renew ``leases`` in one round trip; return the indices of the leases NOT renewed.

        Each TTL is replaced (never extended past ``ttl`` from now), and capped at the lease's
        deadline so renewal never outlives its maximum lifetime. One script call whatever the
        number of leases: the keys, the first lease's TTL as the default, the tokens back to
        back in one argument, then (index, TTL) pairs for the leases whose TTL differs. On a
        cluster: one call per lease (its key, its TTL, its token), one round trip per node.
        """
        if not leases:
            return []
        ttls = [
            lease.ttl_ms if lease.deadline is None else _ms(min(lease.ttl, lease.deadline - now))
            for lease in leases
        ]
        if self.server.cluster:
            return self.server.run_each(
                self._renew,
                [([lease.key], [ttl_ms, lease.token]) for lease, ttl_ms in zip(leases, ttls)],
            )
        default_ms = leases[0].ttl_ms
        args: list[Any] = [default_ms, "".join(lease.token for lease in leases)]
        for index, ttl_ms in enumerate(ttls):
            if ttl_ms != default_ms:
                args += (index + 1, ttl_ms)
        keys = [lease.key for lease in leases]
        lost = self.server.run(self._renew, keys[0], keys, args)
        return [int(index) - 1 for index in lost]

    def renew_by_owner(
        self, held: Sequence[tuple[str, Owner, float]], *, limits: Optional[Sequence[int]] = None
    ) -> list[int]:
        """Renew, in one round trip, each lock ``name`` whose value names exactly ``owner``,
        for ``ttl`` seconds; return the indices (into ``held``) of the locks NOT renewed.

        ``held`` is ``(name, owner, ttl)`` per lock. For a supervisor keeping alive the locks
        of its children without knowing their tokens (a child whose body holds the GIL cannot
        renew its own lease). A lock that is gone (released, expired) or held by any other
        owner is left untouched; none is ever created. Each TTL is replaced, never added to.
        ``limits``: each lock's ``lock_limit`` (default 1): the owner's slot, whichever it is,
        is renewed (every slot is sent; those of other owners are left untouched).
        """
        if not held:
            return []
        if limits is not None and any(limit != 1 for limit in limits):
            return self._renew_slots_by_owner(held, limits)
        keys = [self.issuer.keys(name).lock for name, _, _ in held]
        if self.server.cluster:  # one call per key (one slot each)
            return self.server.run_each(
                self._renew_by_owner,
                [([key], [owner.fields, _ms(ttl)]) for key, (_, owner, ttl) in zip(keys, held)],
            )
        args = [owner.fields for _, owner, _ in held] + [_ms(ttl) for _, _, ttl in held]
        lost = self.server.run(self._renew_by_owner, keys[0], keys, args)
        return [int(index) - 1 for index in lost]

    def _renew_slots_by_owner(
        self, held: Sequence[tuple[str, Owner, float]], limits: Sequence[int]
    ) -> list[int]:
        """:meth:`renew_by_owner` with a lock's every slot sent: a lock is lost when none of
        its slots names its owner."""
        entries: list[tuple[str, Owner, float]] = []
        of: list[int] = []  # the index into ``held`` of each slot sent
        for index, ((name, owner, ttl), limit) in enumerate(zip(held, limits)):
            keys = self.issuer.keys(name)
            for slot in range(1, limit + 1):
                entries.append((slots.slot_key(keys, slot), owner, ttl))
                of.append(index)
        calls = [([key], [owner.fields, _ms(ttl)]) for key, owner, ttl in entries]
        if self.server.cluster:
            lost_slots = set(self.server.run_each(self._renew_by_owner, calls))
        else:
            keys_sent = [key for key, _, _ in entries]
            args = [owner.fields for _, owner, _ in entries] + [_ms(t) for _, _, t in entries]
            reply = self.server.run(self._renew_by_owner, keys_sent[0], keys_sent, args)
            lost_slots = {int(index) - 1 for index in reply}
        renewed = {of[index] for index in range(len(entries)) if index not in lost_slots}
        return [index for index in range(len(held)) if index not in renewed]
