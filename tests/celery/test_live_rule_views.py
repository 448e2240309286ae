"""Where a live rule (``celery locks limit`` / ``pause``) shows, on a real Redis: ``locks list``
(its lines, its ``--json`` rows and ``--rules``), ``locks show``, and the console's
``locks.json`` and page, each naming the live cap and the pause with when it ends. (The
Django admin's page: tests/celery/django_admin/test_admin_rules.py.)"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from celery_singleton_lock.engine import Owner, RedisLocker, Renewer
from celery_singleton_lock.testing import RedisServer
from tests.celery.test_cli import run_cli
from tests.celery.test_console import (  # noqa: F401 - the fixtures, used by name
    ConsoleAt,
    browser,
    chromium,
    console_at,
)

FAMILY = "app.job"
NAME = f"{FAMILY}:ab"


def _locker(server: RedisServer) -> RedisLocker:
    return RedisLocker(server.client(), renewer=Renewer(autostart=False))


def listed(server: RedisServer, *args: str) -> Any:
    done = run_cli("--url", server.url, "list", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_list_json_rows_carry_their_familys_live_cap_and_pause_end(
    redis_server: RedisServer,
) -> None:
    locker = _locker(redis_server)
    locker.try_acquire(NAME, 30, owner=Owner(task_id="t-1"), renew=False)
    locker.live_rules.set_cap(FAMILY, 2)
    before = time.time()
    locker.live_rules.pause(FAMILY, 60)
    (row,) = json.loads(listed(redis_server, "--json"))
    assert (row["live_cap"], row["paused"]) == (2, True)
    assert before + 55 < row["paused_until"] < time.time() + 61


def test_list_json_rows_of_a_family_without_a_rule_say_none(redis_server: RedisServer) -> None:
    _locker(redis_server).try_acquire(NAME, 30, owner=Owner(task_id="t-1"), renew=False)
    (row,) = json.loads(listed(redis_server, "--json"))
    assert (row["live_cap"], row["paused"], row["paused_until"]) == (None, False, None)


def test_list_rules_json_names_a_paused_family_that_holds_no_lock(
    redis_server: RedisServer,
) -> None:
    _locker(redis_server).live_rules.pause(FAMILY, 60)
    (rule,) = json.loads(listed(redis_server, "--rules", "--json"))
    assert (rule["family"], rule["live_cap"], rule["paused"]) == (FAMILY, None, True)
    assert 55 < rule["paused_for"] <= 60


def test_list_rules_json_gives_a_pause_until_resumed_no_end(redis_server: RedisServer) -> None:
    _locker(redis_server).live_rules.pause(FAMILY, None)
    (rule,) = json.loads(listed(redis_server, "--rules", "--json"))
    assert (rule["paused"], rule["paused_for"], rule["paused_until"]) == (True, None, None)


def test_list_says_when_a_pause_ends(redis_server: RedisServer) -> None:
    _locker(redis_server).live_rules.pause(FAMILY, 60)
    year = time.strftime("%Y", time.gmtime())
    assert f"{FAMILY}: paused: no start for" in listed(redis_server)
    assert f"more, until {year}-" in listed(redis_server, "--rules")


def test_show_says_when_the_pause_ends(redis_server: RedisServer) -> None:
    _locker(redis_server).live_rules.pause(FAMILY, 60)
    shown = run_cli("--url", redis_server.url, "show", NAME)
    assert "paused: no start for" in shown.stdout and "more, until " in shown.stdout


def test_the_consoles_snapshot_lists_the_live_rules(
    redis_server: RedisServer,
    console_at: ConsoleAt,  # noqa: F811 - the fixture
) -> None:
    locker = _locker(redis_server)
    locker.live_rules.set_cap(FAMILY, 3)
    locker.live_rules.pause("app.other", None)
    with urllib.request.urlopen(f"{console_at()}locks.json", timeout=10) as response:
        rules = json.loads(response.read())["rules"]
    assert [(r["family"], r["live_cap"], r["paused"]) for r in rules] == [
        (FAMILY, 3, False),
        ("app.other", None, True),
    ]


def test_the_console_page_shows_a_pause_beside_the_live_cap(
    redis_server: RedisServer,
    console_at: ConsoleAt,  # noqa: F811 - the fixture
    browser: Any,  # noqa: F811 - the fixture
) -> None:
    from tests.celery.test_console import by, wait

    locker = _locker(redis_server)
    locker.live_rules.set_cap(FAMILY, 3)
    locker.live_rules.pause(FAMILY, None)
    browser.get(console_at())
    rows = by.By.CSS_SELECTOR, "#rules tr"
    wait.WebDriverWait(browser, 15).until(lambda d: d.find_elements(*rows))
    text = str(browser.find_element(by.By.ID, "rules").text)
    assert (FAMILY in text, "3" in text, "until resumed" in text) == (True, True, True)
