"""MkDocs hook: reference pages generated from the code, and stale code paths refused.

A page may hold these markers, each on a line of its own; the build replaces them:

- ``<!-- generated: task-options -->``: a table of every task option (name, app setting,
  default, allowed values, meaning), from the declarations the package validates with;
- ``<!-- generated: app-settings -->``: the same for the app-wide settings;
- ``<!-- generated: cli -->``: the ``--help`` of ``celery locks`` and of each of its commands,
  from the click group pyproject.toml declares as Celery's entry point (so this file need not
  know the module that defines it).

A repository path written as inline code (`` `celery_singleton_lock/engine/locker.py` ``) in a
page, README.md or CONTRIBUTING.md must name a file or folder that exists: otherwise a
warning, which ``mkdocs build --strict`` makes an error, so a module moved or renamed cannot
leave the docs pointing at nothing.

The generators are pure functions, tested in ``tests/unit/test_docs_reference.py``.
"""

from __future__ import annotations

import importlib
import logging
import re
import sys
from pathlib import Path
from typing import Any, Iterable, Optional

import click

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python < 3.11
    import tomli as tomllib

from celery_singleton_lock.celery.config import options

ROOT = Path(__file__).resolve().parents[2]

# mkdocs counts warnings of loggers under "mkdocs"; --strict fails the build on any
log = logging.getLogger("mkdocs.hooks.reference")

MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)

#: top folders of the repository whose paths the docs name; a code span that starts with one
#: of them is taken for a path
PATH_ROOTS = ("celery_singleton_lock/", "examples/", "tests/", "bench/", "ci/", "docs/")
CODE_PATH = re.compile(r"`((?:" + "|".join(map(re.escape, PATH_ROOTS)) + r")[\w./-]*)`")


def _cell(text: str) -> str:
    """Text made safe for one cell of a Markdown table."""
    return text.replace("|", "\\|").replace("\n", " ")


def _code(value: Any) -> str:
    return f"`{_cell(repr(value))}`"


def _table(header: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def task_options_table() -> str:
    """Every task option: the ones with an app setting, then the per-task ones. The setting
    shares the name's cell: five columns of long identifiers do not fit a page."""
    rows = [
        (f"`{name}`<br>`{o.setting}`", _code(o.default), _cell(str(o.allowed)), _cell(o.meaning))
        for name, o in options.TASK_OPTIONS.items()
    ]
    rows += [
        (f"`{name}`<br>(no setting)", _code(o.default), _cell(str(o.allowed)), _cell(o.meaning))
        for name, o in options.TASK_ONLY_OPTIONS.items()
    ]
    header = ("task attribute<br>app setting", "default", "allowed", "meaning")
    return _table(header, rows)


def app_settings_table() -> str:
    """Every app-wide setting that no task attribute overrides."""
    rows = [
        (f"`{name}`", _code(o.default), _cell(str(o.allowed)), _cell(o.meaning))
        for name, o in options.APP_SETTINGS.items()
    ]
    return _table(("app setting", "default", "allowed", "meaning"), rows)


def _declared_command(group: str, name: str) -> click.Command:
    """The click command pyproject.toml declares under entry point ``group`` / ``name`` (read
    from the file, not the installed metadata, which may be another checkout's)."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        target = tomllib.load(f)["project"]["entry-points"][group][name]
    module, _, attribute = target.partition(":")
    command = getattr(importlib.import_module(module), attribute)
    assert isinstance(command, click.Command), target
    return command


def _help(command: click.Command, name: str, parent: Optional[click.Context]) -> str:
    ctx = click.Context(command, info_name=name, parent=parent, terminal_width=88)
    return command.get_help(ctx)


def cli_help() -> str:
    """The help of ``celery -A proj locks`` and of each of its commands."""
    group = _declared_command("celery.commands", "locks")
    assert isinstance(group, click.Group)
    parent = click.Context(group, info_name="celery -A proj locks", terminal_width=88)
    blocks = [("celery -A proj locks --help", _help(group, "celery -A proj locks", None))]
    for name in group.list_commands(parent):
        command = group.get_command(parent, name)
        assert command is not None, name
        blocks.append((f"celery -A proj locks {name} --help", _help(command, name, parent)))
    return "\n".join(f"### `{title}`\n\n```text\n{text}\n```\n" for title, text in blocks)


GENERATORS = {
    "task-options": task_options_table,
    "app-settings": app_settings_table,
    "cli": cli_help,
}


def expand(markdown: str) -> str:
    """``markdown`` with every generated-content marker replaced.

    Raises:
        KeyError: a marker names no generator.
    """
    return MARKER.sub(lambda match: GENERATORS[match.group(1)](), markdown)


def missing_paths(markdown: str, root: Path = ROOT) -> list[str]:
    """Repository paths named as inline code in ``markdown`` that do not exist under ``root``."""
    return sorted({path for path in CODE_PATH.findall(markdown) if not (root / path).exists()})


#: files outside the site whose paths are checked all the same
CHECKED_OUTSIDE = ("README.md", "CONTRIBUTING.md")


def on_pre_build(**_: Any) -> None:
    """MkDocs event: check the paths the README and CONTRIBUTING.md name."""
    for name in CHECKED_OUTSIDE:
        for path in missing_paths((ROOT / name).read_text()):
            log.warning("%s names %s, which does not exist", name, path)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """MkDocs event: expand the markers of one page and check the paths it names."""
    for path in missing_paths(markdown):
        log.warning("%s names %s, which does not exist", page.file.src_uri, path)
    try:
        return expand(markdown)
    except KeyError as exc:
        log.warning("%s: no generator for marker %s", page.file.src_uri, exc)
        return markdown
