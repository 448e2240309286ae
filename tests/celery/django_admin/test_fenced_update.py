"""The Django ORM helper on the real PostgreSQL (a database alias ``fencing`` beside the
project's own, its ``search_path`` the test's schema): ``QuerySet.update`` made conditional on
the lock's fence."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from celery_singleton_lock.errors import StaleFenceError
from tests.postgres_support import accounts_schema

pytest.importorskip("psycopg")

ALIAS = "fencing"


@pytest.fixture(scope="module")
def account_model(django_site: None) -> Any:
    """A model on the ``accounts`` table the contrib conftest creates (unmanaged)."""
    from django.db import models

    class Account(models.Model):
        balance = models.IntegerField()
        fence = models.BigIntegerField(null=True)

        class Meta:
            app_label = "celery_singleton_lock"
            db_table = "accounts"
            managed = False

    return Account


@pytest.fixture
def accounts(account_model: Any) -> Iterator[Any]:
    """``Account`` rows 1 (fence 5) and 2 (fence NULL), through the ``fencing`` alias."""
    from django.db import connections

    with accounts_schema() as url:
        schema = url.rsplit("?schema=", 1)[1]
        connections.settings[ALIAS] = {
            **connections.settings["default"],
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "test",
            "USER": "postgres",
            "HOST": "127.0.0.1",
            "PORT": "5432",
            "OPTIONS": {"options": f"-c search_path={schema}"},
        }
        try:
            yield account_model.objects.using(ALIAS)
        finally:
            connections[ALIAS].close()
            del connections[ALIAS]
            del connections.settings[ALIAS]


def test_a_newer_fence_updates_the_row_and_stores_the_fence(accounts: Any) -> None:
    from django.db.models import F

    from celery_singleton_lock.contrib.django.fencing import fenced_update

    assert fenced_update(accounts.filter(pk=1), 6, balance=F("balance") + 10) == 1
    assert accounts.values_list("balance", "fence").get(pk=1) == (10, 6)


def test_an_older_fence_is_refused_and_writes_nothing(accounts: Any) -> None:
    from celery_singleton_lock.contrib.django.fencing import fenced_update

    with pytest.raises(StaleFenceError) as refused:
        fenced_update(accounts.filter(pk=1), 4, balance=10)
    assert (refused.value.fence, refused.value.seen) == (4, 5)
    assert accounts.values_list("balance", "fence").get(pk=1) == (0, 5)


def test_a_model_instance_names_its_own_row(accounts: Any) -> None:
    from celery_singleton_lock.contrib.django.fencing import fenced_update

    fenced_update(accounts.get(pk=2), 1, balance=3)
    assert accounts.values_list("balance", "fence").get(pk=2) == (3, 1)


def test_no_matching_row_raises_the_models_does_not_exist(accounts: Any) -> None:
    from celery_singleton_lock.contrib.django.fencing import fenced_update

    with pytest.raises(accounts.model.DoesNotExist):
        fenced_update(accounts.filter(pk=99), 7, balance=1)
