"""The lock console (WSGI, served by wsgiref) against a real Redis, driven by a real headless
Chromium (Debian's chromium + chromedriver, through selenium) where a person would use it, and
by plain HTTP requests where the point is what a request without the page does."""

from __future__ import annotations

import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Iterator

import pytest
from celery import Celery

from celery_singleton_lock.celery.cli.console import LockConsole, make_console
from celery_singleton_lock.celery.observe.serving import quiet_server
from celery_singleton_lock.engine import Owner, RedisLocker, Renewer
from celery_singleton_lock.testing import RedisServer
from tests.celery.chromium import headless_chromium

by = pytest.importorskip("selenium.webdriver.common.by")
wait = pytest.importorskip("selenium.webdriver.support.wait")

NAME = "proj.rebuild:abc123"
KEY = f"singleton-lock:{{{NAME}}}"
#: a worker node that no worker answers for: the holder is gone
GONE = Owner(task_id="t-gone", host="gone@nowhere", pid=4242)


@pytest.fixture
def held(redis_server: RedisServer) -> Iterator[RedisLocker]:
    locker = RedisLocker(redis_server.client(), renewer=Renewer(autostart=False))
    locker.try_acquire(NAME, 300, owner=GONE, fencing=True, renew=False)
    yield locker


ConsoleAt = Callable[..., str]


@pytest.fixture
def console_at(own_app: Celery) -> Iterator[ConsoleAt]:
    """``console_at(allow_release=...)``: serve a console on a free port; its base URL."""
    started: list[tuple[Any, LockConsole]] = []

    def start(**options: Any) -> str:
        console = make_console(own_app, ping_timeout=0.3, **options)
        server = quiet_server("127.0.0.1", 0, console)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append((server, console))
        return f"http://127.0.0.1:{server.server_port}/"

    yield start
    for server, console in started:
        server.shutdown()
        server.server_close()
        console.close()


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """One browser for the module (starting one takes a second or two): each test serves a
    console of its own on a port of its own, and the console keeps nothing in the browser
    (its CSRF token is a form field, not a cookie)."""
    driver = headless_chromium()
    yield driver
    driver.quit()


@pytest.fixture
def browser(chromium: Any) -> Any:
    """The module's browser on a blank page (nothing of the previous test's console shown)."""
    chromium.get("about:blank")
    return chromium


def table_text(driver: Any) -> str:
    """The lock table once the page's script has filled it."""
    rows = by.By.CSS_SELECTOR, "#locks tr"
    wait.WebDriverWait(driver, 15).until(lambda d: d.find_elements(*rows))
    return str(driver.find_element(by.By.ID, "locks").text)


def open_confirmation(driver: Any, base: str) -> None:
    """Click the release button of the only lock listed: the confirmation page shows."""
    driver.get(base)
    table_text(driver)
    driver.find_element(by.By.CSS_SELECTOR, "#locks button").click()
    wait.WebDriverWait(driver, 15).until(lambda d: "Release this lock?" in d.title)


def http(url: str, data: dict[str, str] | None = None) -> int:
    """Status of a GET (or, with ``data``, a form POST) to ``url``."""
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    try:
        with urllib.request.urlopen(url, data=body, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_the_console_lists_a_held_lock_with_its_holder_node_and_pid(
    held: RedisLocker, console_at: ConsoleAt, browser: Any
) -> None:
    browser.get(console_at())
    text = table_text(browser)
    assert (KEY in text, "gone@nowhere" in text, "4242" in text) == (True, True, True)


def test_the_console_says_the_holder_node_does_not_answer(
    held: RedisLocker, console_at: ConsoleAt, browser: Any
) -> None:
    browser.get(console_at())
    assert "does not answer" in table_text(browser)


@pytest.mark.parametrize("path", ["release", "release/confirm", "release/anything"])
def test_a_get_to_a_release_url_leaves_the_lock_held(
    held: RedisLocker, console_at: ConsoleAt, redis_server: RedisServer, path: str
) -> None:
    base = console_at(allow_release=True)
    query = urllib.parse.urlencode({"name": NAME, "task_id": GONE.task_id, "confirm": "yes"})
    http(f"{base}{path}?{query}")
    assert redis_server.client().exists(KEY) == 1


def test_a_get_to_a_release_url_is_answered_method_not_allowed(
    held: RedisLocker, console_at: ConsoleAt
) -> None:
    assert http(f"{console_at(allow_release=True)}release?name={NAME}") == 405


def test_a_release_post_without_the_csrf_token_leaves_the_lock_held(
    held: RedisLocker, console_at: ConsoleAt, redis_server: RedisServer
) -> None:
    form = {"name": NAME, "task_id": GONE.task_id, "confirm": "yes"}
    http(f"{console_at(allow_release=True)}release", form)
    assert redis_server.client().exists(KEY) == 1


def test_a_read_only_console_offers_no_release_button(
    held: RedisLocker, console_at: ConsoleAt, browser: Any
) -> None:
    browser.get(console_at())
    table_text(browser)
    assert browser.find_elements(by.By.CSS_SELECTOR, "#locks button") == []


def test_the_confirmed_post_releases_a_lock_whose_holder_is_gone(
    held: RedisLocker, console_at: ConsoleAt, browser: Any, redis_server: RedisServer
) -> None:
    open_confirmation(browser, console_at(allow_release=True))
    browser.find_element(by.By.CSS_SELECTOR, "form button").click()
    wait.WebDriverWait(browser, 15).until(lambda d: d.title in ("Released", "Not released"))
    assert (browser.title, redis_server.client().exists(KEY)) == ("Released", 0)


def test_the_confirmation_step_alone_leaves_the_lock_held(
    held: RedisLocker, console_at: ConsoleAt, browser: Any, redis_server: RedisServer
) -> None:
    open_confirmation(browser, console_at(allow_release=True))
    assert redis_server.client().exists(KEY) == 1


def test_the_release_button_of_a_slot_releases_that_slot_only(
    redis_server: RedisServer, console_at: ConsoleAt, browser: Any
) -> None:
    locker = RedisLocker(redis_server.client(), renewer=Renewer(autostart=False))
    for task_id in ("t-slot-1", "t-slot-2"):
        owner = Owner(task_id=task_id, host="gone@nowhere", pid=4242)
        locker.try_acquire(NAME, 300, owner=owner, limit=3, renew=False)
    slot_2 = f"{KEY}:slot:2"
    browser.get(console_at(allow_release=True))
    table_text(browser)
    row = next(
        tr for tr in browser.find_elements(by.By.CSS_SELECTOR, "#locks tr") if slot_2 in tr.text
    )
    row.find_element(by.By.CSS_SELECTOR, "button").click()
    wait.WebDriverWait(browser, 15).until(lambda d: "Release this lock?" in d.title)
    browser.find_element(by.By.CSS_SELECTOR, "form button").click()
    wait.WebDriverWait(browser, 15).until(lambda d: d.title in ("Released", "Not released"))
    still = [holder.key for holder in locker.inspect.holders(NAME, 3)]
    assert (browser.title, still) == ("Released", [KEY])
