"""The admin's page of locks through Django's test client, against a real Redis: who sees it,
what it shows, and that a release is a permitted POST with the CSRF token, owner-checked and
refused while the holder's node answers a ping unless forced."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest
from celery import Celery

from celery_singleton_lock.celery.config.lockers import locker_for
from celery_singleton_lock.engine import LockKeys, Owner, RedisLocker, Renewer
from celery_singleton_lock.testing import RedisServer
from tests.celery.django_admin.conftest import GONE, KEY, NAME, PAGE, RELEASE

ClientOf = Callable[..., Any]
FORM = {"key": KEY, "task_id": GONE.task_id}


def page_text(client: Any) -> str:
    response = client.get(PAGE)
    assert response.status_code == 200
    return str(response.content.decode())


def said(response: Any) -> str:
    """The messages the page shows after a release (followed redirect)."""
    return " ".join(str(message) for message in response.context["messages"])


# -- who sees the page ---------------------------------------------------------------------


def test_the_page_lists_a_held_lock_with_its_holder_node_and_pid(
    lock_app: Celery, held: RedisLocker, client_of: ClientOf
) -> None:
    text = page_text(client_of(perms=("view_lock",)))
    assert (KEY in text, "gone@nowhere" in text, "4242" in text) == (True, True, True)


def test_the_page_says_the_holder_node_does_not_answer_a_ping(
    lock_app: Celery, held: RedisLocker, client_of: ClientOf
) -> None:
    assert "does not answer a ping" in page_text(client_of(perms=("view_lock",)))


def test_the_admin_index_links_the_locks_page(lock_app: Celery, client_of: ClientOf) -> None:
    index = client_of(perms=("view_lock",)).get("/admin/").content.decode()
    assert f'href="{PAGE}"' in index


def test_an_anonymous_visitor_is_sent_to_the_login_page(lock_app: Celery) -> None:
    from django.test import Client

    response = Client().get(PAGE)
    assert (response.status_code, response["Location"].split("?")[0]) == (302, "/admin/login/")


def test_a_user_who_is_not_staff_is_sent_to_the_login_page(
    lock_app: Celery, client_of: ClientOf
) -> None:
    response = client_of(staff=False, perms=("view_lock", "release_lock")).get(PAGE)
    assert (response.status_code, response["Location"].split("?")[0]) == (302, "/admin/login/")


def test_a_staff_user_without_the_view_permission_is_refused(
    lock_app: Celery, held: RedisLocker, client_of: ClientOf
) -> None:
    assert client_of().get(PAGE).status_code == 403


def test_a_viewer_without_the_release_permission_gets_no_release_button(
    lock_app: Celery, held: RedisLocker, client_of: ClientOf
) -> None:
    assert f'action="{RELEASE}"' not in page_text(client_of(perms=("view_lock",)))


def test_a_user_with_the_release_permission_gets_a_release_button(
    lock_app: Celery, held: RedisLocker, client_of: ClientOf
) -> None:
    assert f'action="{RELEASE}"' in page_text(client_of(perms=("view_lock", "release_lock")))


def test_the_page_says_when_the_lock_server_cannot_be_read(
    django_site: None, client_of: ClientOf
) -> None:
    from django.test import override_settings

    with RedisServer.running() as server:
        url = server.url
    app = Celery("gone-server", broker=url, set_as_current=False)
    app.conf.singleton_lock_url = url
    with override_settings(CELERY_SINGLETON_LOCK_APP=app):
        text = page_text(client_of(perms=("view_lock",)))
    app.close()
    assert 'id="lock-error"' in text


# -- what it shows -------------------------------------------------------------------------


def test_the_page_shows_each_held_slot_of_a_lock_limit(
    lock_app: Celery, redis_server: RedisServer, client_of: ClientOf
) -> None:
    locker = RedisLocker(redis_server.client(), renewer=Renewer(autostart=False))
    first, second = (Owner(task_id=t, host=GONE.host, pid=GONE.pid) for t in ("t-s1", "t-s2"))
    locker.try_acquire(NAME, 300, owner=first, limit=3, renew=False)
    locker.try_acquire(NAME, 300, owner=second, limit=3, renew=False)
    text = page_text(client_of(perms=("view_lock",)))
    assert (f"{KEY}:slot:2" in text, "t-s1" in text, "t-s2" in text) == (True, True, True)


def test_the_page_shows_a_lock_in_its_cooldown(
    lock_app: Celery, redis_server: RedisServer, client_of: ClientOf
) -> None:
    locker = RedisLocker(redis_server.client(), renewer=Renewer(autostart=False))
    lease = locker.try_acquire(NAME, 300, owner=GONE, renew=False)
    assert locker.cooldown.release_cooling(lease, 300) is True  # type: ignore[arg-type]
    assert "cooldown, " in page_text(client_of(perms=("view_lock",)))


def test_the_page_shows_what_the_rate_window_of_a_lock_holds(
    lock_app: Celery, redis_server: RedisServer, client_of: ClientOf
) -> None:
    locker = RedisLocker(redis_server.client(), renewer=Renewer(autostart=False))
    locker.try_acquire(NAME, 300, owner=GONE, rate=(5, 600), renew=False)
    assert "rate: 1 start(s) in the window" in page_text(client_of(perms=("view_lock",)))


def test_the_page_names_the_calls_parked_behind_a_lock(
    lock_app: Celery, held: RedisLocker, redis_server: RedisServer, client_of: ClientOf
) -> None:
    # what a parked call leaves: its task id in the lock's parked set, by arrival
    parked = LockKeys.build("singleton-lock", NAME).parked
    redis_server.client().zadd(parked, {"t-parked-1": 1, "t-parked-2": 2})
    text = page_text(client_of(perms=("view_lock",)))
    assert "parked: 2 call(s), oldest first: t-parked-1 t-parked-2" in text


def test_the_page_lists_a_queued_marker(
    lock_app: Celery, redis_server: RedisServer, client_of: ClientOf
) -> None:
    locker = RedisLocker(redis_server.client(), renewer=Renewer(autostart=False))
    assert locker.markers is not None
    assert locker.markers.enqueue(NAME, "t-queued", 600) is None
    text = page_text(client_of(perms=("view_lock",)))
    assert (NAME in text, "t-queued" in text) == (True, True)


def test_the_app_setting_takes_the_apps_dotted_path(django_site: None) -> None:
    from django.test import override_settings

    from celery_singleton_lock.contrib.django.lock_server import lock_app
    from tests.celery.django_admin import proj

    with override_settings(CELERY_SINGLETON_LOCK_APP="tests.celery.django_admin.proj:app"):
        assert lock_app() is proj.app


# -- releasing -----------------------------------------------------------------------------


BOTH = ("view_lock", "release_lock")
#: the ways a release is refused, each as a request made by a logged-in client
REFUSED = {
    "a GET": lambda client_of: client_of(perms=BOTH).get(RELEASE, FORM),
    "a POST without the CSRF token": lambda client_of: client_of(csrf=True, perms=BOTH).post(
        RELEASE, FORM
    ),
    "a POST without the release permission": lambda client_of: client_of(perms=("view_lock",)).post(
        RELEASE, FORM
    ),
}


@pytest.mark.parametrize(
    ("asked", "status"),
    [
        ("a GET", 405),
        ("a POST without the CSRF token", 403),
        ("a POST without the release permission", 403),
    ],
)
def test_a_refused_release_is_answered_with_its_status(
    lock_app: Celery, held: RedisLocker, client_of: ClientOf, asked: str, status: int
) -> None:
    assert REFUSED[asked](client_of).status_code == status


@pytest.mark.parametrize("asked", REFUSED)
def test_a_refused_release_leaves_the_lock_held(
    lock_app: Celery, held: RedisLocker, client_of: ClientOf, redis_server: RedisServer, asked: str
) -> None:
    REFUSED[asked](client_of)
    assert redis_server.client().exists(KEY) == 1


def test_a_release_post_with_the_permission_releases_a_lock_whose_holder_is_gone(
    lock_app: Celery, held: RedisLocker, client_of: ClientOf, redis_server: RedisServer
) -> None:
    client_of(perms=("view_lock", "release_lock")).post(RELEASE, FORM)
    assert redis_server.client().exists(KEY) == 0


def test_a_release_post_with_the_csrf_token_of_the_page_releases_the_lock(
    lock_app: Celery, held: RedisLocker, client_of: ClientOf, redis_server: RedisServer
) -> None:
    client = client_of(csrf=True, perms=("view_lock", "release_lock"))
    token = client.get(PAGE).context["csrf_token"]
    client.post(RELEASE, {**FORM, "csrfmiddlewaretoken": str(token)})
    assert redis_server.client().exists(KEY) == 0


def test_a_superuser_releases_without_a_granted_permission(
    lock_app: Celery, held: RedisLocker, client_of: ClientOf, redis_server: RedisServer
) -> None:
    client_of(superuser=True).post(RELEASE, FORM)
    assert redis_server.client().exists(KEY) == 0


def test_the_page_says_the_lock_was_released(
    lock_app: Celery, held: RedisLocker, client_of: ClientOf
) -> None:
    response = client_of(superuser=True).post(RELEASE, FORM, follow=True)
    assert f"lock {KEY} released" in said(response)


def test_a_lock_that_changed_hands_since_the_page_is_not_released(
    lock_app: Celery, held: RedisLocker, client_of: ClientOf, redis_server: RedisServer
) -> None:
    form = {"key": KEY, "task_id": "t-shown-before"}
    response = client_of(superuser=True).post(RELEASE, form, follow=True)
    assert ("changed hands" in said(response), redis_server.client().exists(KEY)) == (True, 1)


@pytest.fixture
def held_outside(redis_server: RedisServer) -> str:
    """A lock taken outside a worker: its host is no node that a ping can ask."""
    locker = RedisLocker(redis_server.client(), renewer=Renewer(autostart=False))
    outside = Owner(task_id="t-outside", host="some-host", pid=99)
    locker.try_acquire(NAME, 300, owner=outside, renew=False)
    return "t-outside"


def test_a_holder_that_cannot_be_asked_is_not_released_unforced(
    lock_app: Celery, held_outside: str, client_of: ClientOf, redis_server: RedisServer
) -> None:
    form = {"key": KEY, "task_id": held_outside}
    response = client_of(superuser=True).post(RELEASE, form, follow=True)
    assert ("cannot be asked" in said(response), redis_server.client().exists(KEY)) == (True, 1)


def test_a_forced_release_does_not_ask_the_holder(
    lock_app: Celery, held_outside: str, client_of: ClientOf, redis_server: RedisServer
) -> None:
    form = {"key": KEY, "task_id": held_outside, "force": "yes"}
    client_of(superuser=True).post(RELEASE, form)
    assert redis_server.client().exists(KEY) == 0


@pytest.fixture
def held_by_the_worker(worker: Any, celery_app: Celery, django_site: None) -> Iterator[str]:
    """A lock whose holder names the in-process worker's node, which answers a ping; that
    worker's app is ``CELERY_SINGLETON_LOCK_APP``."""
    from django.test import override_settings

    locker = locker_for(celery_app)
    name = "proj.admin-alive:abc"
    lease = locker.try_acquire(
        name, 300, owner=Owner(task_id="t-alive", host=worker.hostname, pid=7), renew=False
    )
    with override_settings(CELERY_SINGLETON_LOCK_APP=celery_app):
        yield locker.keys(name).lock
    locker.release(lease)  # type: ignore[arg-type]


def test_a_holder_whose_node_answers_a_ping_is_not_released_unforced(
    held_by_the_worker: str, client_of: ClientOf, store: Any
) -> None:
    form = {"key": held_by_the_worker, "task_id": "t-alive"}
    response = client_of(superuser=True).post(RELEASE, form, follow=True)
    assert ("answered ping" in said(response), store.exists(held_by_the_worker)) == (True, 1)


def test_the_page_says_a_holder_whose_node_answers_is_running(
    held_by_the_worker: str, client_of: ClientOf
) -> None:
    assert "answers a ping (running)" in page_text(client_of(superuser=True))
