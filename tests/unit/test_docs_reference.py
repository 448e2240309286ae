"""The reference pages the docs site generates (docs/hooks/reference.py, a MkDocs hook): the
options tables list every option the package declares, with what users need to know of it, and
a page that names a repository path that does not exist is refused."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from celery_singleton_lock.celery.config.options import (
    APP_SETTINGS,
    KNOWN_SETTINGS,
    TASK_ONLY_OPTIONS,
    TASK_OPTIONS,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hook", ROOT / "docs/hooks/reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(table: str) -> dict[str, list[str]]:
    """A generated Markdown table's body rows, by the name that starts their first cell."""
    body = [line for line in table.splitlines() if line.startswith("| `")]
    cells = [[cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]] for line in body]
    return {row[0].split("<br>")[0].strip("`"): row for row in cells}


def test_the_task_options_table_has_a_row_for_every_declared_task_option(
    hook: ModuleType,
) -> None:
    assert set(rows(hook.task_options_table())) == set(TASK_OPTIONS) | set(TASK_ONLY_OPTIONS)


def test_a_task_option_row_shows_its_setting_default_allowed_values_and_meaning(
    hook: ModuleType,
) -> None:
    table = rows(hook.task_options_table())
    for name, option in TASK_OPTIONS.items():
        assert table[name] == [
            f"`{name}`<br>`{option.setting}`",
            f"`{option.default!r}`",
            str(option.allowed),
            option.meaning,
        ]


def test_the_app_settings_table_has_a_row_for_every_declared_app_setting(
    hook: ModuleType,
) -> None:
    assert set(rows(hook.app_settings_table())) == set(APP_SETTINGS)


def test_a_pipe_in_a_cell_is_escaped_so_the_row_keeps_its_columns(hook: ModuleType) -> None:
    prefix = rows(hook.app_settings_table())["singleton_lock_prefix"]
    assert len(prefix) == 4
    assert "\\|" in prefix[2]


def test_every_setting_a_worker_accepts_is_in_the_reference(hook: ModuleType) -> None:
    tables = hook.task_options_table() + hook.app_settings_table()
    assert {name for name in KNOWN_SETTINGS if f"`{name}`" not in tables} == set()


def test_every_declared_option_has_allowed_values_and_a_one_line_meaning() -> None:
    declared = {**TASK_OPTIONS, **TASK_ONLY_OPTIONS, **APP_SETTINGS}
    for name, option in declared.items():
        assert str(option.allowed).strip(), name
        assert option.meaning.strip() and "\n" not in option.meaning, name


def test_a_marker_in_a_page_is_replaced_by_its_generated_table(hook: ModuleType) -> None:
    page = "# Options\n\n<!-- generated: app-settings -->\n\nafter\n"
    assert hook.expand(page) == ("# Options\n\n" + hook.app_settings_table() + "\n\nafter\n")


def test_the_options_page_holds_both_markers() -> None:
    page = (ROOT / "docs/reference/options.md").read_text()
    assert "<!-- generated: task-options -->" in page.splitlines()
    assert "<!-- generated: app-settings -->" in page.splitlines()


def test_a_repository_path_that_does_not_exist_is_reported(hook: ModuleType) -> None:
    page = "see `celery_singleton_lock/errors.py` and `celery_singleton_lock/celery/gone.py`"
    assert hook.missing_paths(page) == ["celery_singleton_lock/celery/gone.py"]
