"""The rule index (``P:rules``, keys.py's rule_index): the families with a live rule, read by
``celery locks list`` and the console instead of a SCAN, trimmed by its reader of the families
found without a rule (lua/trim_rules.lua), on a real Redis."""

from __future__ import annotations

import time

import redis

from celery_singleton_lock.engine import RedisLocker
from celery_singleton_lock.engine.lua_scripts import source


def test_a_family_whose_cap_was_reset_is_dropped_from_the_index_when_listed(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    locker.live_rules.set_cap("proj.job", 2)
    locker.live_rules.set_cap("proj.job", None)
    assert locker.live_rules.every() == {}
    assert redis_client.smembers("t:rules") == set()


def test_a_family_whose_pause_ended_by_itself_is_dropped_with_its_rule(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    locker.live_rules.pause("proj.job", 0.05)
    time.sleep(0.2)  # the pause's end passed by any clock: the field lingers
    assert redis_client.exists("t:cap:proj.job") == 1
    assert locker.live_rules.every() == {}
    assert redis_client.smembers("t:rules") == set()
    assert redis_client.exists("t:cap:proj.job") == 0


def test_the_families_with_a_rule_keep_their_entries_beside_one_trimmed(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    locker.live_rules.pause("proj.paused", None)
    locker.live_rules.set_cap("proj.capped", 3)
    locker.live_rules.set_cap("proj.reset", 1)
    locker.live_rules.set_cap("proj.reset", None)
    assert sorted(locker.live_rules.every()) == ["proj.capped", "proj.paused"]
    assert redis_client.smembers("t:rules") == {b"proj.capped", b"proj.paused"}


def test_a_family_given_a_rule_again_after_the_read_keeps_its_entry(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    locker.live_rules.pause("proj.job", 30)  # set again since a reader found it without one
    trim = redis_client.register_script(source("trim_rules"))
    removed = trim(keys=["t:rules", "t:cap:proj.job"], args=["proj.job"], client=redis_client)
    assert removed == 0 and redis_client.smembers("t:rules") == {b"proj.job"}
