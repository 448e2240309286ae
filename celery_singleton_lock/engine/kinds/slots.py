"""Up to N holders of one lock name, and a rate of starts (``lock_limit``, ``lock_rate``): one
of N slots taken in one round trip (lua/acquire_slot.lua, on the lock's slot table,
:mod:`..slots`). Parking behind the slots is :mod:`.slot_queue`'s job."""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

from redis.commands.core import Script

from celery_singleton_lock.engine import lease as _lease
from celery_singleton_lock.engine import server_errors
from celery_singleton_lock.engine.acquire_request import AcquireOutcome, AcquireRequest
from celery_singleton_lock.engine.keys import LockKeys
from celery_singleton_lock.engine.kinds.mutex import confirm_replicas, send
from celery_singleton_lock.engine.lease import LockHolder, Owner, already_finished, new_token
from celery_singleton_lock.engine.lua_scripts import source
from celery_singleton_lock.engine.redis_server import RedisServer, _ms
from celery_singleton_lock.engine.server_leases import Issuer

log_acquire = logging.getLogger("celery_singleton_lock.acquire")


class Slots:
    """One of N slots, within a rate, on ``server``."""

    def __init__(self, server: RedisServer, issuer: Issuer) -> None:
        self.server = server
        self.issuer = issuer
        self._acquire_slot: Script = server.register(source("acquire_slot"))

    def acquire(self, request: AcquireRequest, owner: Owner) -> AcquireOutcome:
        """Take one of ``request.limit`` slots, within ``request.rate``, in one round trip."""
        issuer = self.issuer
        keys = issuer.keys(request.name)
        token = request.token or new_token()
        sent_at = issuer.renewer.clock()
        value = f"{token}||{int(issuer.wall_clock() * 1000)}|{owner.fields}"
        script_keys, args = acquire_call(
            keys,
            request.limit,
            _ms(request.ttl),
            value,
            request.fencing,
            request.rate,
            issuer.shared.of(keys.lock, owner.task_id),
            owner.task_id,
            request.unless_finished,
            issuer.shared.rule_of(request.cap_key, keys.lock),  # a cluster's: the slot's copy
            issuer.held_keys,
        )
        script = self._acquire_slot
        reply, acknowledged = send(self.server, script, keys, script_keys, args, request)
        if type(reply) is list:
            slot, fence = int(reply[0]), int(reply[1])
            if slot == 0 and len(reply) > 2:  # paused by the live rule for ``fence`` ms
                return LockHolder.paused_for(keys.lock, fence)
            if slot == 0:  # over the rate: ``fence`` is the wait in ms
                return LockHolder(keys.lock, "", "", None, None, None, fence / 1000.0, False, True)
            lease = issuer.lease(request, keys, token, owner, fence or None, sent_at, slot=slot)
            confirm_replicas(lease, acknowledged, request)
            log_acquire.debug("acquired %s (fence=%s)", lease.key, lease.fence)
            return lease
        if reply == -1:
            raise already_finished(keys, owner)
        pttl, _, fields = _lease.as_text(reply).partition("|")
        holder = LockHolder.parse(keys.lock, fields, pttl)
        if holder is None:
            raise server_errors.not_a_lock(keys.lock)
        return holder


def acquire_call(
    keys: LockKeys,
    limit: int,
    ttl_ms: int,
    value: str,
    fencing: bool,
    rate: Optional[tuple[int, float]],
    shared: tuple[str, str],
    task_id: str,
    unless_finished: bool,
    cap_key: str = "",
    held: Sequence[str] = (),
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of lua/acquire_slot.lua (``rate``: at most that many starts per that many
    seconds, or None; ``shared``: the fence counter and the finish-record set of ``task_id``
    on the lock's server or slot; ``unless_finished``: to look for that record; ``cap_key``:
    the task's live cap, or "")."""
    counter, finished = shared
    script_keys = [*keys.slot_table, counter, keys.starts, finished]
    if cap_key:
        script_keys.append(cap_key)
    args: list[Any] = [ttl_ms, value, "1" if fencing else "0", limit]
    args += ("", "") if rate is None else (rate[0], max(1, int(rate[1] * 1000)))
    args += (task_id, "1" if unless_finished else "", "1" if held else "")
    script_keys += held  # the held index, last (ARGV[9])
    return script_keys, args
