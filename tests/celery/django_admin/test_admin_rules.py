"""The admin's page of locks shows the live caps and pauses of tasks and groups (``celery
locks limit`` / ``pause``), with when each pause ends, through Django's test client against a
real Redis."""

from __future__ import annotations

from typing import Any, Callable

from celery import Celery

from celery_singleton_lock.engine import RedisLocker, Renewer
from celery_singleton_lock.testing import RedisServer
from tests.celery.django_admin.conftest import PAGE

ClientOf = Callable[..., Any]


def rules_of(server: RedisServer) -> Any:
    return RedisLocker(server.client(), renewer=Renewer(autostart=False)).live_rules


def page_text(client: Any) -> str:
    response = client.get(PAGE)
    assert response.status_code == 200
    return str(response.content.decode())


def test_the_page_shows_a_pause_and_its_end_beside_the_live_cap(
    lock_app: Celery, redis_server: RedisServer, client_of: ClientOf
) -> None:
    rules = rules_of(redis_server)
    rules.set_cap("proj.rebuild", 2)
    rules.pause("proj.rebuild", 60)
    text = page_text(client_of(perms=("view_lock",)))
    row = text[text.index('<tr class="rule-row">') :]
    row = row[: row.index("</tr>")]
    assert "proj.rebuild" in row and "<td>2</td>" in row and "s more)" in row


def test_the_page_says_a_pause_lasts_until_resumed(
    lock_app: Celery, redis_server: RedisServer, client_of: ClientOf
) -> None:
    rules_of(redis_server).pause("proj.rebuild", None)
    assert "until resumed" in page_text(client_of(perms=("view_lock",)))


def test_the_page_says_no_family_has_a_rule(lock_app: Celery, client_of: ClientOf) -> None:
    assert 'id="no-rules"' in page_text(client_of(perms=("view_lock",)))
