"""The live rule of a task's or group's locks (``celery locks limit``, ``locks pause`` and
``resume``, a body's ``self.request.lock.pause_for``): one small hash per family, ``P:cap:F``
(:func:`.keys.cap_key`), with a field ``cap`` (at most that many slots taken at once) and a
field ``until`` (no body starts before that server time in ms; -1 until resumed). Every acquire
of the family's locks reads it in the same script call (lua/includes/live_rule.lua), so it
costs no round trip; the parked calls' hand-off reads it too, and looks again when a pause
ends (so a parked call wakes then, and nothing polls meanwhile).

On a Redis Cluster each lock's keys carry their own hash tag (the whole lock name), and a
script may touch keys of one slot only: one key per family cannot sit beside each of its
locks. So a cluster keeps a copy of the rule in every one of its 16,384 slots,
``P:cap:F:{T}`` (``T`` the slot's tag, :func:`.keys.slot_tag`), and an acquire reads
the copy in its lock's slot (:meth:`.SharedKeys.rule_of`). A copy per slot, not per slot that
holds a lock of the family now: the family's next lock may land in any slot. A change writes
every copy, one cluster pipeline (one round trip per primary): its copies change one by one
while it runs, and every lock reads the new rule once it returns. A read takes slot 0's copy.
Each copy is a small hash: what 16,384 of them cost is in docs/explanation/benchmarks.md.
"""

from __future__ import annotations

from typing import Any, Optional, cast

from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.crc import REDIS_CLUSTER_HASH_SLOTS

from celery_singleton_lock.engine import redis_server, server_errors
from celery_singleton_lock.engine.backend import LiveRule
from celery_singleton_lock.engine.keys import SharedKeys, cap_key, handoff_index, rule_index
from celery_singleton_lock.engine.lua_scripts import source
from celery_singleton_lock.engine.redis_server import EachKey, RedisServer
from celery_singleton_lock.engine.slot_sweep import DueSlots

#: the slots of a Redis Cluster, each with its copy of a family's rule
_SLOTS = range(REDIS_CLUSTER_HASH_SLOTS)


class RedisLiveRules:
    """The live rules of the families under ``prefix`` on ``server`` (one server, Sentinel,
    or a Cluster: a copy per slot, see the module docstring)."""

    def __init__(self, server: RedisServer, prefix: str) -> None:
        self.server = server
        self.prefix = prefix
        self._pause: Script = server.register(source("pause"))
        self._trim: Script = server.register(source("trim_rules"))
        #: a Cluster's summary of its due slots (slot_sweep.py), marked where a pause or a
        #: resume made parked locks due now
        self._due_slots: Optional[DueSlots] = None
        if server.cluster:
            self._due_slots = DueSlots(server, prefix, handoff_index(prefix))

    def key(self, family: str) -> str:
        """The rule's key of ``family`` (a task's or group's name)."""
        return cap_key(self.prefix, family)

    def pause(self, family: str, seconds: Optional[float], *, lengthen: bool = False) -> float:
        """No body of ``family``'s locks starts for ``seconds`` (None: until :meth:`resume`),
        from every worker's next acquire on. ``lengthen``: only make a pause longer (a body's
        ``pause_for``: a shorter one never cuts a longer one short). Returns the pause's end,
        server seconds since the epoch (``inf``: until resumed)."""
        if seconds is not None and not seconds > 0:
            raise ValueError(f"a pause lasts a positive number of seconds, got {seconds!r}")
        ms = "" if seconds is None else max(1, int(seconds * 1000))
        return self._set(family, ms, lengthen)

    def resume(self, family: str) -> None:
        """End ``family``'s pause now: its parked calls are handed their slots at once."""
        self._set(family, 0, False)

    def _set(self, family: str, ms: Any, lengthen: bool) -> float:
        key, prefix, server = self.key(family), self.prefix, self.server
        args = [ms, "1" if lengthen else "", f"{family}:"]
        if not server.cluster:
            keys = [key, handoff_index(prefix), rule_index(prefix)]
            till = int(server.run(self._pause, key, keys, args)[0])
            return float("inf") if till == -1 else till / 1000.0
        if ms != 0:  # in another slot than the copies: listed apart, before them
            index = rule_index(prefix)
            server_errors.call(lambda: server.client.sadd(index, family), index)
        handoff, of_slot = handoff_index(prefix), SharedKeys.of_slot
        calls = [([of_slot(key, slot), of_slot(handoff, slot)], args) for slot in _SLOTS]
        # each copy's own server clock: a node reads its copies with it
        replies = redis_server.run(self._pause, key, [], [], EachKey(server.client, calls))
        ends = [int(end) for end, _ in replies]
        # the slots whose parked locks were made due now: a sweeper reads them at its next
        # tick (a resume, or a pause it must look at to schedule its end)
        assert self._due_slots is not None
        self._due_slots.mark_slots(slot for slot, (_, moved) in enumerate(replies) if moved)
        return float("inf") if -1 in ends else max(ends) / 1000.0

    def set_cap(self, family: str, cap: Optional[int]) -> None:
        """Set ``family``'s live cap (None: remove it)."""
        key, client, index = self.key(family), self.server.client, rule_index(self.prefix)
        copies = [key]
        if self.server.cluster:
            copies = [SharedKeys.of_slot(key, slot) for slot in _SLOTS]

        def write() -> Any:
            # one server: a transaction; a cluster: a pipeline, one round trip per primary
            pipe = client.pipeline(transaction=not self.server.cluster)
            for copy in copies:
                if cap is None:
                    pipe.hdel(copy, "cap")
                else:
                    pipe.hset(copy, "cap", cap)
            if cap is not None:
                pipe.sadd(index, family)  # listed by every() without a SCAN
            return pipe.execute()

        server_errors.call(write, key)

    def read(self, family: str) -> LiveRule:
        """``family``'s rule now (one round trip: the hash and the server's clock; on a
        cluster slot 0's copy and its node's clock)."""
        return self._read_all([family])[0]

    def _read_all(self, families: list[str]) -> list[LiveRule]:
        """The rules of ``families`` now, in one pipelined round trip (each hash, then the
        server's clock; on a cluster their copies in slot 0, all on one node, and its clock)."""
        client = self.server.client
        keys = [self.key(family) for family in families]

        def each() -> Any:
            if isinstance(client, RedisCluster):  # the copies' node: TIME has no key to route
                copies = [SharedKeys.of_slot(key, 0) for key in keys]
                node = cast(Any, client).get_node_from_key(copies[0])
                pipe = node.redis_connection.pipeline(transaction=False)
            else:
                copies, pipe = keys, client.pipeline(transaction=False)
            for copy in copies:
                pipe.hmget(copy, "cap", "until")
            pipe.time()
            return pipe.execute()

        *rules, (seconds, micros) = server_errors.call(each, keys[0] if keys else self.prefix)
        now = seconds * 1000 + micros // 1000
        return [_rule(cap, till, now) for cap, till in rules]

    def every(self, limit: int = 1000) -> dict[str, LiveRule]:
        """The families with a live cap or pause now, by family: read from the rule index (no
        SCAN of the database; at most ``limit`` of its families) in one round trip. The
        families found without a rule (a cap reset, a pause over) are dropped from the index
        then (lua/trim_rules.lua, as the held index's readers drop the keys they find gone),
        so the index holds what the rules hold, not every family ever paused. Not on a
        cluster: a family's copies and the index share no slot, so the drop could not check
        the rule again in the same script, and a rule set again meanwhile would go unlisted;
        an entry left there costs a read, never a wrong answer."""
        client, index = self.server.client, rule_index(self.prefix)
        families: list[str] = []
        for family in server_errors.call(lambda: client.sscan_iter(index, count=500), index):
            families.append(family.decode() if isinstance(family, bytes) else family)
            if len(families) >= limit:
                break
        families.sort()
        rules = dict(zip(families, self._read_all(families))) if families else {}
        gone = [family for family, rule in rules.items() if rule == (None, None)]
        if gone and not self.server.cluster:
            keys = [index, *(self.key(family) for family in gone)]
            self.server.run(self._trim, index, keys, gone)
        return {family: rule for family, rule in rules.items() if rule != (None, None)}


def _rule(cap: Any, till: Any, now_ms: int) -> LiveRule:
    """The rule of the hash fields ``cap`` and ``until`` at server time ``now_ms``."""
    paused_for: Optional[float] = None
    if till is not None:
        end = int(till)
        if end == -1:
            paused_for = float("inf")
        elif end > now_ms:
            paused_for = (end - now_ms) / 1000.0
    return LiveRule(None if cap is None else int(cap), paused_for)
