"""The admin's page of locks in a real headless Chromium (Debian's chromium + chromedriver,
through selenium), as a person uses it: log in, see the lock, click Release. Skips without
them (``.ci/run`` installs both; tests/celery/chromium.py)."""

from __future__ import annotations

import threading
from typing import Any, Iterator

import pytest
from celery import Celery

from celery_singleton_lock.celery.observe.serving import quiet_server
from celery_singleton_lock.engine import RedisLocker
from celery_singleton_lock.testing import RedisServer
from tests.celery.chromium import headless_chromium
from tests.celery.django_admin.conftest import KEY, PAGE, MakeUser

by = pytest.importorskip("selenium.webdriver.common.by")
wait = pytest.importorskip("selenium.webdriver.support.wait")


@pytest.fixture
def site_url(lock_app: Celery) -> Iterator[str]:
    """The Django project served on a free loopback port (its static files too); the test
    database in memory is shared with the server's thread (sqlite's shared cache)."""
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.core.handlers.wsgi import WSGIHandler

    server = quiet_server("127.0.0.1", 0, StaticFilesHandler(WSGIHandler()))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def browser() -> Iterator[Any]:
    driver = headless_chromium()
    yield driver
    driver.quit()


def log_in(driver: Any, site: str, name: str) -> None:
    """Through the admin's own login form, as a person would."""
    driver.get(f"{site}{PAGE}")
    driver.find_element(by.By.ID, "id_username").send_keys(name)
    driver.find_element(by.By.ID, "id_password").send_keys("pw")
    driver.find_element(by.By.CSS_SELECTOR, "input[type=submit]").click()
    wait.WebDriverWait(driver, 30).until(lambda d: d.find_elements(by.By.ID, "content-main"))


def test_a_person_logs_in_sees_the_lock_and_releases_it(
    held: RedisLocker,
    site_url: str,
    browser: Any,
    make_user: MakeUser,
    redis_server: RedisServer,
) -> None:
    make_user("operator", perms=("view_lock", "release_lock"))
    log_in(browser, site_url, "operator")
    wait.WebDriverWait(browser, 30).until(lambda d: d.find_elements(by.By.ID, "held-locks"))
    assert KEY in browser.find_element(by.By.ID, "held-locks").text
    browser.find_element(by.By.CSS_SELECTOR, "#held-locks button.release").click()
    wait.WebDriverWait(browser, 30).until(
        lambda d: d.find_elements(by.By.CSS_SELECTOR, "ul.messagelist")
    )
    # the admin's style shows the message's first letter in capitals
    message = browser.find_element(by.By.CSS_SELECTOR, "ul.messagelist").text.lower()
    assert (f"lock {KEY} released" in message, redis_server.client().exists(KEY)) == (True, 0)
