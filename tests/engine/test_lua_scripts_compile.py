"""Every Lua script of the engine compiles on a real server (SCRIPT LOAD)."""

from __future__ import annotations

from importlib import resources

import pytest
import redis

from celery_singleton_lock.engine.lua_scripts import source

LUA = resources.files("celery_singleton_lock.engine") / "lua"
SCRIPTS = sorted(f.name[:-4] for f in LUA.iterdir() if f.name.endswith(".lua"))


def test_every_script_loads(redis_client: redis.Redis) -> None:
    assert {"acquire", "acquire_slot_or_park", "hand_on_slots", "release"} <= set(SCRIPTS)
    for name in SCRIPTS:
        text = source(name)
        try:
            sha = redis_client.script_load(text)
        except redis.ResponseError as exc:  # pragma: no cover - the failure's message
            pytest.fail(f"{name}.lua does not compile: {exc}")
        assert redis_client.script_exists(sha) == [True]
