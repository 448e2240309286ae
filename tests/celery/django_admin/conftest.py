"""A Django project (``settings.py`` here) set up once per session, its test database in
memory, for the admin's page of locks; users made per test and deleted after it; a lock held
through the engine by a holder whose node no worker answers for."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest
from celery import Celery

from celery_singleton_lock.engine import LockKeys, Owner, RedisLocker, Renewer
from celery_singleton_lock.testing import RedisServer
from tests.celery.django_admin import settings as site_settings

NAME = "proj.rebuild:abc123"
KEY = LockKeys.build("singleton-lock", NAME).lock
#: a worker node that no worker answers for: the holder is gone
GONE = Owner(task_id="t-gone", host="gone@nowhere", pid=4242)
PAGE = "/admin/celery_singleton_lock/lock/"
RELEASE = "/admin/celery_singleton_lock/lock/release/"


@pytest.fixture(scope="session")
def django_site() -> Iterator[None]:
    """Django configured from ``settings.py`` and its tables made, once per session; the
    tests skip without Django (extra ``[django]``)."""
    django = pytest.importorskip("django")
    from django.conf import settings
    from django.db import connection
    from django.test.utils import setup_test_environment, teardown_test_environment

    if not settings.configured:
        settings.configure(**{k: v for k, v in vars(site_settings).items() if k.isupper()})
    django.setup()
    setup_test_environment()
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    yield
    connection.creation.destroy_test_db(old_name, verbosity=0)
    teardown_test_environment()


@pytest.fixture
def lock_app(django_site: None, own_app: Celery) -> Iterator[Celery]:
    """The test's own Celery app (its lock server and broker this test's Redis) as
    ``CELERY_SINGLETON_LOCK_APP``."""
    from django.test import override_settings

    with override_settings(CELERY_SINGLETON_LOCK_APP=own_app):
        yield own_app


MakeUser = Callable[..., Any]


@pytest.fixture
def make_user(django_site: None) -> Iterator[MakeUser]:
    """``make_user(name, staff=True, perms=("view_lock",), superuser=False)``: a user with
    the password ``pw``; every user made is deleted after the test."""
    from django.contrib.auth.models import Permission, User

    made: list[Any] = []

    def make(
        name: str, *, staff: bool = True, perms: tuple[str, ...] = (), superuser: bool = False
    ) -> Any:
        user = User.objects.create_user(name, password="pw", is_staff=staff)
        user.is_superuser = superuser
        user.save()
        for codename in perms:
            user.user_permissions.add(
                Permission.objects.get(
                    content_type__app_label="celery_singleton_lock", codename=codename
                )
            )
        made.append(user)
        return User.objects.get(pk=user.pk)  # a fresh object: no permission cache

    yield make
    for user in made:
        user.delete()


@pytest.fixture
def client_of(make_user: MakeUser) -> Callable[..., Any]:
    """``client_of(perms=..., staff=..., csrf=False)``: a test client logged in as a new user."""
    from django.test import Client

    count = iter(range(1000))

    def login(*, csrf: bool = False, **options: Any) -> Any:
        client = Client(enforce_csrf_checks=csrf)
        client.force_login(make_user(f"user{next(count)}", **options))
        return client

    return login


@pytest.fixture
def held(redis_server: RedisServer) -> RedisLocker:
    """Lock ``NAME`` held by ``GONE`` for 300 s, taken through the engine."""
    locker = RedisLocker(redis_server.client(), renewer=Renewer(autostart=False))
    locker.try_acquire(NAME, 300, owner=GONE, fencing=True, renew=False)
    return locker
