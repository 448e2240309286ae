"""Renewal on one server: a batch of leases by their tokens (the pool's renewer thread, one
round trip per tick for every lease of the process), and the locks of a supervisor's children
by their owner fields (the worker's main process, which knows no child's token). Beside the
renewer (:mod:`.renewer`), which calls it through the backend of each lease.

A script call blocks Redis while it runs (2-4 us per lease), so the leases go in chunks of
``CHUNK``, one script call each, all sent in one pipeline and their replies read together:
still one round trip per tick, and no call over a few ms whatever the number of leases.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from redis.commands.core import Script

from celery_singleton_lock.engine import script_calls, slots
from celery_singleton_lock.engine.kinds.issuer import Issuer
from celery_singleton_lock.engine.lease import Lease, Owner
from celery_singleton_lock.engine.lua_scripts import source
from celery_singleton_lock.engine.redis_server import RedisServer
from celery_singleton_lock.engine.script_calls import EachKey, _ms

#: leases per script call: 2-4 us each (more as the keyspace grows), plus ~2-4 us each for its
#: entry in the held index (a sorted set of every held lock: O(log n) per update), so a call
#: blocks Redis ~1.5 ms at 50,000 leases (one call over all of them blocked it 224 ms; chunks
#: of 500 with the index ~3 ms)
CHUNK = 250

Calls = list[tuple[list[str], list[Any]]]  # (KEYS, ARGV) of each script call


class ServerRenewal:
    """The renewals on ``server``, by token and by owner."""

    def __init__(self, server: RedisServer, issuer: Issuer) -> None:
        self.server = server
        self.issuer = issuer
        self._renew: Script = server.register(source("renew"))
        self._renew_by_owner: Script = server.register(source("renew_by_owner"))
        #: (lock name, owner fields) -> the slot of its lock_limit that owner was renewed on at
        #: the last call (see :meth:`_renew_slots_by_owner`)
        self._owner_slots: dict[tuple[str, str], int] = {}

    def renew_batch(self, leases: Sequence[Lease], *, now: float) -> list[int]:
        """Renew ``leases`` in one round trip; return the indices of the leases NOT renewed.

        Each TTL is replaced (never extended past ``ttl`` from now), and capped at the lease's
        deadline so renewal never outlives its maximum lifetime. One script call per
        ``CHUNK`` leases: the keys, the chunk's first TTL as the default, the tokens back to
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
        calls: Calls = []
        for start in range(0, len(leases), CHUNK):
            chunk = leases[start : start + CHUNK]
            default_ms = chunk[0].ttl_ms
            args: list[Any] = [default_ms, "".join(lease.token for lease in chunk)]
            for index, ttl_ms in enumerate(ttls[start : start + CHUNK]):
                if ttl_ms != default_ms:
                    args += (index + 1, ttl_ms)
            calls.append(([*(lease.key for lease in chunk), *self.issuer.held_keys], args))
        return self._run_chunks(self._renew, calls)

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
        is renewed (those of other owners are left untouched; which slots are sent:
        :meth:`_renew_slots_by_owner`).
        """
        if not held:
            return []
        if limits is not None and any(limit != 1 for limit in limits):
            return self._renew_slots_by_owner(held, limits)
        return self._by_owner([(self.issuer.keys(name).lock, owner, t) for name, owner, t in held])

    def _renew_slots_by_owner(
        self, held: Sequence[tuple[str, Owner, float]], limits: Sequence[int]
    ) -> list[int]:
        """:meth:`renew_by_owner` of locks with a lock_limit: a lock is lost when none of its
        slots names its owner.

        The main process knows no child's slot, only its owner fields. The first call for an
        owner sends every slot of its lock (O(N): 1,164 us of server time at N = 1,000 with
        N-1 held) and remembers the slot renewed; later calls send that slot alone (O(1) per
        held slot, what every tick of a long body then costs). The memory is rebuilt from each
        call's renewals: it holds the slots of the current batch only (the supervisor sends
        every running child's lock on this server in each call), so it never grows past it. A
        remembered slot that no longer names its owner is reported lost for that call and
        forgotten: the next call sends every slot again (an owner holds one slot at a time;
        it can only have moved if that very task id took another slot since, e.g. a retry
        in the same child, and the child's own renewer renews it meanwhile).
        """
        entries: list[tuple[str, Owner, float]] = []
        sent: list[tuple[int, int]] = []  # (index into ``held``, slot) of each key sent
        known = self._owner_slots
        for index, ((name, owner, ttl), limit) in enumerate(zip(held, limits)):
            keys = self.issuer.keys(name)
            slot = known.get((name, owner.fields))
            for number in (slot,) if slot is not None and slot <= limit else range(1, limit + 1):
                entries.append((slots.slot_key(keys, number), owner, ttl))
                sent.append((index, number))
        lost_slots = set(self._by_owner(entries))
        found: dict[tuple[str, str], int] = {}
        for position, (index, number) in enumerate(sent):
            if position not in lost_slots:
                name, owner, _ = held[index]
                found[(name, owner.fields)] = number
        self._owner_slots = found
        renewed = {index for position, (index, _) in enumerate(sent) if position not in lost_slots}
        return [index for index in range(len(held)) if index not in renewed]

    def _by_owner(self, entries: list[tuple[str, Owner, float]]) -> list[int]:
        """Renew each ``(key, owner, ttl)`` of ``entries`` held by that owner (see
        lua/renew_by_owner.lua); the indices of those NOT renewed."""
        if self.server.cluster:  # one call per key (one slot each)
            calls = [([key], [owner.fields, _ms(ttl)]) for key, owner, ttl in entries]
            return self.server.run_each(self._renew_by_owner, calls)
        chunks = (entries[start : start + CHUNK] for start in range(0, len(entries), CHUNK))
        calls = [
            (
                [key for key, _, _ in chunk],
                [owner.fields for _, owner, _ in chunk] + [_ms(ttl) for _, _, ttl in chunk],
            )
            for chunk in chunks
        ]
        return self._run_chunks(self._renew_by_owner, calls)

    def _run_chunks(self, script: Script, calls: Calls) -> list[int]:
        """Run ``script`` once per chunk of ``calls`` in one round trip (one pipeline of raw
        EVALSHA commands, :class:`~.script_calls.EachKey`; a lone chunk as one call); each
        reply lists the 1-based indices of its chunk's keys not renewed: returned as indices
        over every chunk."""
        if len(calls) == 1:
            keys, args = calls[0]
            replies = [self.server.run(script, keys[0], keys, args)]
        else:
            client = EachKey(self.server.client, calls)
            replies = script_calls.run(script, calls[0][0][0], [], [], client)
        return [
            chunk * CHUNK + int(index) - 1 for chunk, reply in enumerate(replies) for index in reply
        ]
