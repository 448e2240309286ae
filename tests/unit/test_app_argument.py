"""celery's ``-A`` as typed, read from the command line where Celery < 5.5 keeps only the app."""

from __future__ import annotations

import pytest

from celery_singleton_lock.command_line import app_argument


@pytest.mark.parametrize(
    "argv",
    [
        ["-A", "proj.app", "locks", "doctor"],
        ["--app", "proj.app", "locks", "doctor"],
        ["--app=proj.app", "locks", "doctor"],
        ["-Aproj.app", "locks", "doctor"],
        ["--broker", "redis://x", "-A", "proj.app", "locks", "list"],
    ],
)
def test_the_app_is_read_in_each_spelling_of_the_option(argv: list[str]) -> None:
    assert app_argument(argv) == "proj.app"


def test_no_app_option_gives_none() -> None:
    assert app_argument(["locks", "list"]) is None


def test_an_option_of_the_sub_command_is_not_taken_for_celerys() -> None:
    assert app_argument(["locks", "show", "-A", "not.this"]) is None
