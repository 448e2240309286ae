"""The live rule of a task's or group's locks (``celery locks limit``, ``locks pause`` and
``resume``, a body's ``self.request.lock.pause_for``): one small hash per family, ``P:cap:F``
(:func:`.keys.cap_key`), with a field ``cap`` (at most that many slots taken at once) and a
field ``until`` (no body starts before that server time in ms; -1 until resumed). Every acquire
of the family's locks reads it in the same script call (lua/includes/live_rule.lua), so it
costs no round trip; the parked calls' hand-off reads it too, and looks again when a pause
ends (so a parked call wakes then, and nothing polls meanwhile).

One key per family serves every lock of it, so it sits in one hash slot: read only on one
server or a Sentinel group's primary. On a Redis Cluster each lock's keys carry their own hash
tag (the whole lock name), and a script may touch keys of one slot only: the family's key
cannot be read beside each of its locks, so a cluster has no live rule (:class:`.RedisLocker`'s
``live_rules`` is None there, and the commands refuse it).
"""

from __future__ import annotations

from typing import Any, Optional

from redis.commands.core import Script

from celery_singleton_lock.engine import server_errors
from celery_singleton_lock.engine.backend import LiveRule
from celery_singleton_lock.engine.keys import cap_key, handoff_index, rule_index
from celery_singleton_lock.engine.lua_scripts import source
from celery_singleton_lock.engine.redis_server import RedisServer


class RedisLiveRules:
    """The live rules of the families under ``prefix`` on ``server`` (one server or
    Sentinel)."""

    def __init__(self, server: RedisServer, prefix: str) -> None:
        self.server = server
        self.prefix = prefix
        self._pause: Script = server.register(source("pause"))
        self._trim: Script = server.register(source("trim_rules"))

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
        key = self.key(family)
        keys = [key, handoff_index(self.prefix), rule_index(self.prefix)]
        args = [ms, "1" if lengthen else "", f"{family}:"]
        till = int(self.server.run(self._pause, key, keys, args))
        return float("inf") if till == -1 else till / 1000.0

    def set_cap(self, family: str, cap: Optional[int]) -> None:
        """Set ``family``'s live cap (None: remove it)."""
        key, client, index = self.key(family), self.server.client, rule_index(self.prefix)

        def write() -> Any:
            pipe = client.pipeline(transaction=True)
            if cap is None:
                pipe.hdel(key, "cap")
            else:
                pipe.hset(key, "cap", cap)
                pipe.sadd(index, family)  # listed by every() without a SCAN
            return pipe.execute()

        server_errors.call(write, key)

    def read(self, family: str) -> LiveRule:
        """``family``'s rule now (one round trip: the hash and the server's clock)."""
        return self._read_all([family])[0]

    def _read_all(self, families: list[str]) -> list[LiveRule]:
        """The rules of ``families`` now, in one pipelined round trip (each hash, then the
        server's clock)."""
        client = self.server.client
        keys = [self.key(family) for family in families]

        def each() -> Any:
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.hmget(key, "cap", "until")
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
        so the index holds what the rules hold, not every family ever paused."""
        client, index = self.server.client, rule_index(self.prefix)
        families: list[str] = []
        for family in server_errors.call(lambda: client.sscan_iter(index, count=500), index):
            families.append(family.decode() if isinstance(family, bytes) else family)
            if len(families) >= limit:
                break
        families.sort()
        rules = dict(zip(families, self._read_all(families))) if families else {}
        gone = [family for family, rule in rules.items() if rule == (None, None)]
        if gone:
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
