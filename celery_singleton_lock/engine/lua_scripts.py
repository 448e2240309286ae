"""The engine's Lua scripts, read from ``lua/<name>.lua`` with their includes expanded.

A script file starts with its contract (``-- KEYS[i]``, ``-- ARGV[i]``, ``-- Returns``), then
names the shared functions it uses, one ``--- @include "<name>"`` line each (the file
``lua/includes/<name>.lua``). Each include is expanded in place, its own includes first, and
at most once per script: a second include of the same file is dropped, so every function is
defined once. See ``lua/README.md``.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

from celery_singleton_lock.errors import LockError

_INCLUDE = re.compile(r'^--- @include "([^"]+)"[ \t]*$', re.MULTILINE)


@functools.cache
def source(name: str) -> str:
    """The text of the script ``lua/<name>.lua``, includes expanded (read once)."""
    return _expand(_read(name), name, stack=(), done=set())


def _read(path: str, needed_by: str = "") -> str:
    file = resources.files("celery_singleton_lock.engine") / "lua"
    for part in f"{path}.lua".split("/"):
        file = file / part
    try:
        return file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LockError(f"lua/{path}.lua{needed_by} is missing from the package") from None


def _expand(text: str, path: str, *, stack: tuple[str, ...], done: set[str]) -> str:
    """``text`` (of ``path``) with each ``@include`` replaced by its file, expanded; ``stack``:
    the includes being expanded around it, ``done``: those already in the script."""

    def include(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in stack:
            cycle = " -> ".join((*stack, name))
            raise LockError(f"Lua include cycle in {path}.lua: {cycle}")
        if name in done:  # its functions are already defined above
            return ""
        done.add(name)
        text = _read(f"includes/{name}", f", included by {path}.lua,")
        return _expand(text, path, stack=(*stack, name), done=done)

    return _INCLUDE.sub(include, text)
