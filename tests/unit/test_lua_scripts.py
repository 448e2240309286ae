"""The engine's Lua files: each script headed by its contract, every include found, and each
shared function defined once per script after the includes are expanded."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from celery_singleton_lock.engine import lua_scripts
from celery_singleton_lock.engine.kinds.slot_queue import HANDOFF_TOKEN
from celery_singleton_lock.engine.latest import MAX_SUPERSEDED
from celery_singleton_lock.engine.lease import TOKEN_LENGTH
from celery_singleton_lock.errors import LockError

LUA = resources.files("celery_singleton_lock.engine") / "lua"
SCRIPTS = sorted(f.name[:-4] for f in LUA.iterdir() if f.name.endswith(".lua"))
INCLUDES = sorted(f.name[:-4] for f in (LUA / "includes").iterdir() if f.name.endswith(".lua"))


def header(name: str) -> list[str]:
    """The comment lines a script file starts with: its contract."""
    lines = (LUA / f"{name}.lua").read_text(encoding="utf-8").splitlines()
    end = next(i for i, line in enumerate(lines) if not line.startswith("--"))
    return lines[:end]


def test_there_are_scripts_and_includes() -> None:
    assert {"acquire", "release", "renew", "acquire_slot", "acquire_slot_or_park"} <= set(SCRIPTS)
    assert {"lock_value", "finish_records", "take_lock", "handoff"} <= set(INCLUDES)


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_starts_with_its_keys_argv_and_returns_contract(name: str) -> None:
    lines = header(name)
    assert not lines[0].startswith(("-- KEYS", "-- ARGV", "--- @include")), "a purpose line first"
    for head in ("-- KEYS[", "-- ARGV[", "-- Returns"):
        assert any(line.startswith(head) for line in lines), f"{name}.lua: no {head} line"


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_include_resolves_and_every_function_is_defined_once(name: str) -> None:
    text = lua_scripts.source(name)
    assert "@include" not in text
    defined = re.findall(r"^local (?:function )?(\w+(?= *\()|[A-Z_]+(?= =))", text, re.MULTILINE)
    assert len(defined) == len(set(defined)), f"{name}.lua defines one twice: {defined}"


@pytest.mark.parametrize("name", INCLUDES)
def test_every_include_is_used_by_a_script(name: str) -> None:
    directive = f'--- @include "{name}"'
    users = [*SCRIPTS, *(f"includes/{other}" for other in INCLUDES)]
    assert any(directive in (LUA / f"{user}.lua").read_text(encoding="utf-8") for user in users)


def test_a_script_carries_only_the_includes_it_names() -> None:
    assert "local function" not in lua_scripts.source("trim_held")
    assert "hand_off" not in lua_scripts.source("acquire")


def test_an_include_named_twice_is_expanded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    files = {
        "main": '--- @include "a"\n--- @include "b"\nreturn f()\n',
        "includes/a": '--- @include "b"\nlocal function g() end\n',
        "includes/b": "local function f() end\n",
    }
    monkeypatch.setattr(lua_scripts, "_read", lambda path, *_: files[path])
    text = lua_scripts._expand(files["main"], "main", stack=(), done=set())
    assert text.count("local function f()") == 1
    assert text.index("local function f()") < text.index("local function g()")


def test_a_script_leaves_out_the_included_functions_it_never_calls() -> None:
    text = lua_scripts._used_only(
        "-- g's comment names h\nlocal function h()\nend\n"
        "local function g()\n  return 1  -- h\nend\n"
        "local function f()\n  return g()\nend\n"
        "return f()\n"
    )
    assert (text.count("local function"), "local function h" in text) == (2, False)


def test_an_unused_function_is_left_out_with_the_comment_above_it() -> None:
    text = lua_scripts._used_only("-- why h\nlocal function h()\nend\nreturn 1\n")
    assert text == "return 1\n"


def test_a_missing_include_is_refused_by_name() -> None:
    with pytest.raises(LockError, match=r"lua/includes/nothing\.lua, included by x\.lua,"):
        lua_scripts._expand('--- @include "nothing"\n', "x", stack=(), done=set())


def test_an_include_cycle_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    files = {"includes/a": '--- @include "b"\n', "includes/b": '--- @include "a"\n'}
    monkeypatch.setattr(lua_scripts, "_read", lambda path, *_: files[path])
    with pytest.raises(LockError, match=r"include cycle in main\.lua: a -> b -> a"):
        lua_scripts._expand('--- @include "a"\n', "main", stack=(), done=set())


def test_the_constants_python_reads_are_the_scripts_own() -> None:
    assert f"local HANDOFF_TOKEN = '{HANDOFF_TOKEN}'" in lua_scripts.source("acquire_slot_or_park")
    assert len(HANDOFF_TOKEN) == TOKEN_LENGTH
    assert f"local MAX_SUPERSEDED = {MAX_SUPERSEDED}\n" in lua_scripts.source("acquire_or_replace")
    assert "string.sub(v, 1, 32)" in lua_scripts.source("release_latest") and TOKEN_LENGTH == 32
