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

from celery_singleton_lock.engine import redis_server
from celery_singleton_lock.engine.lease import Lease, Owner
from celery_singleton_lock.engine.lua_scripts import source
from celery_singleton_lock.engine.redis_server import EachKey, RedisServer, _ms
from celery_singleton_lock.engine.server_leases import Issuer

#: leases per script call: 2-4 us each (more as the keyspace grows), plus ~2-4 us each for its
#: entry in the held index (a sorted set of every held lock: O(log n) per update), so a call
#: blocks Redis ~1.5 ms at 50,000 leases (one call over all of them blocked it 224 ms; chunks
#: of 500 with the index ~3 ms)
CHUNK = 250
#: the same for a batch with slots of a slot table (:mod:`.slots`) and for renewal by owner:
#: 6-8 commands each (and the table's held index entry), ~10 us, so a call stays near 2 ms
SLOT_CHUNK = 200

Calls = list[tuple[list[str], list[Any]]]  # (KEYS, ARGV) of each script call


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
        deadline so renewal never outlives its maximum lifetime. One script call per
        ``CHUNK`` leases (``SLOT_CHUNK`` with slots): each lease's lock key (a slot's: its
        lock's two slot table keys, :mod:`.slots`), the chunk's first TTL as the default, the
        tokens back to back in one argument, which leases are slots, then (index, TTL) pairs
        for the leases whose TTL differs. On a cluster: one call per lease, one round trip per node.
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
                [
                    (_renewed_keys(lease), [ttl_ms, lease.token, "s" if lease.slot else ""])
                    for lease, ttl_ms in zip(leases, ttls)
                ],
            )
        calls: Calls = []
        size = SLOT_CHUNK if any(lease.slot for lease in leases) else CHUNK
        for start in range(0, len(leases), size):
            chunk = leases[start : start + size]
            default_ms = chunk[0].ttl_ms
            layout = "".join("s" if lease.slot else "k" for lease in chunk)
            args: list[Any] = [
                default_ms,
                "".join(lease.token for lease in chunk),
                "" if "s" not in layout else layout,
            ]
            for index, ttl_ms in enumerate(ttls[start : start + size]):
                if ttl_ms != default_ms:
                    args += (index + 1, ttl_ms)
            script_keys = [key for lease in chunk for key in _renewed_keys(lease)]
            calls.append(([*script_keys, *self.issuer.held_keys], args))
        return self._run_chunks(self._renew, calls, size)

    def renew_by_owner(
        self, held: Sequence[tuple[str, Owner, float]], *, limits: Optional[Sequence[int]] = None
    ) -> list[int]:
        """Renew, in one round trip, each lock ``name`` whose value names exactly ``owner``,
        for ``ttl`` seconds; return the indices (into ``held``) of the locks NOT renewed.

        ``held`` is ``(name, owner, ttl)`` per lock. For a supervisor keeping alive the locks
        of its children without knowing their tokens (a child whose body holds the GIL cannot
        renew its own lease). A lock that is gone (released, expired) or held by any other
        owner is left untouched; none is ever created. Each TTL is replaced, never added to.
        Each lock is looked for as its lock key, then as the slot of its slot table its owner
        holds (a ``lock_limit``, :mod:`.slots`: found by owner in O(1), whatever the limit),
        so ``limits`` (each lock's ``lock_limit``) is not needed; it is accepted for the
        backends that use it.
        """
        if not held:
            return []
        entries = [(self.issuer.keys(name), owner, ttl) for name, owner, ttl in held]
        if self.server.cluster:  # one call per lock (its keys share one hash tag)
            calls = [
                ([keys.lock, *keys.slot_table], [owner.fields, _ms(ttl)])
                for keys, owner, ttl in entries
            ]
            return self.server.run_each(self._renew_by_owner, calls)
        size = SLOT_CHUNK
        chunks = (entries[start : start + size] for start in range(0, len(entries), size))
        calls = [
            (
                [key for keys, _, _ in chunk for key in (keys.lock, *keys.slot_table)],
                [owner.fields for _, owner, _ in chunk] + [_ms(ttl) for _, _, ttl in chunk],
            )
            for chunk in chunks
        ]
        return self._run_chunks(self._renew_by_owner, calls, size)

    def _run_chunks(self, script: Script, calls: Calls, size: int) -> list[int]:
        """Run ``script`` once per chunk (of ``size`` leases or locks) of ``calls`` in one round
        trip (one pipeline of raw EVALSHA commands, :class:`~.redis_server.EachKey`; a lone
        chunk as one call); each reply lists the 1-based indices of its chunk's leases not
        renewed: returned as indices over every chunk."""
        if len(calls) == 1:
            keys, args = calls[0]
            replies = [self.server.run(script, keys[0], keys, args)]
        else:
            client = EachKey(self.server.client, calls)
            replies = redis_server.run(script, calls[0][0][0], [], [], client)
        return [
            chunk * size + int(index) - 1 for chunk, reply in enumerate(replies) for index in reply
        ]


def _renewed_keys(lease: Lease) -> list[str]:
    """The keys lua/renew.lua is handed for ``lease``: its lock key, or its lock's slot table."""
    return lease.keys.slot_table if lease.slot else [lease.key]
