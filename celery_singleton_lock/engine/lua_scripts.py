"""The engine's Lua scripts, read from ``lua/<name>.lua`` with their includes expanded.

A script file starts with its contract (``-- KEYS[i]``, ``-- ARGV[i]``, ``-- Returns``), then
names the shared functions it uses, one ``--- @include "<name>"`` line each (the file
``lua/includes/<name>.lua``). Each include is expanded in place, its own includes first, and
at most once per script: a second include of the same file is dropped, so every function is
defined once. Then the included functions the script never calls (directly or through another
it calls) are left out: Redis runs a script's whole text at every call, and defining the ~40
functions a slot script includes cost ~3 us a call, more than its half-dozen commands' own
time (measured with INFO commandstats; see ``docs/explanation/benchmarks.md``). See
``lua/README.md``.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

from celery_singleton_lock.errors import LockError

_INCLUDE = re.compile(r'^--- @include "([^"]+)"[ \t]*$', re.MULTILINE)
#: a comment to the end of its line (no script writes ``--`` inside a string)
_COMMENT = re.compile(r"--.*$", re.MULTILINE)
#: a function of an include: ``local function name(`` at the start of a line, to the first
#: line that is ``end`` alone (its own blocks are indented), with the comment lines above it
_FUNCTION = re.compile(r"^local function (\w+)\(")
_WORD = re.compile(r"\w+")


@functools.cache
def source(name: str) -> str:
    """The text of the script ``lua/<name>.lua``, includes expanded (read once)."""
    return _used_only(_expand(_read(name), name, stack=(), done=set()))


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


def _used_only(text: str) -> str:
    """``text`` without the top-level functions nothing else in it calls: the words of the
    code outside the functions name the functions used, and each used function's words name
    more (comments left out; a word in a string keeps a function: never one too few)."""
    rest: list[str] = []  # lines outside the functions
    functions: dict[str, list[str]] = {}
    order: list[tuple[str, list[str]]] = []  # ("", lines) outside, (name, lines) a function
    pending: list[str] = []  # comment lines that may head the next function
    lines = iter(text.splitlines(keepends=True))
    for line in lines:
        match = _FUNCTION.match(line)
        if match is None:
            if line.startswith("--"):
                pending.append(line)
                continue
            order.append(("", [*pending, line]))
            rest += [*pending, line]
            pending = []
            continue
        block = [*pending, line]
        pending = []
        for inner in lines:
            block.append(inner)
            if inner.rstrip() == "end":
                break
        functions[match.group(1)] = block
        order.append((match.group(1), block))
    order.append(("", pending))
    rest += pending
    used: set[str] = set()

    def words(lines: list[str]) -> list[str]:
        return [w for w in _WORD.findall(_COMMENT.sub("", "".join(lines))) if w in functions]

    waiting = words(rest)
    while waiting:
        name = waiting.pop()
        if name not in used:
            used.add(name)
            waiting += [w for w in words(functions[name]) if w not in used]
    return "".join("".join(block) for name, block in order if not name or name in used)
