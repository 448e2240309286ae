"""Our exceptions cross Celery's result backend intact: pickle, and JSON's ``cls(*args)``."""

from __future__ import annotations

import pickle

import pytest
from celery import Celery
from celery.backends.base import BaseBackend

from celery_singleton_lock import errors

HOLDER = {"key": "p:{t:abc}", "task_id": "t-1", "host": "w1", "pid": 7, "ttl": 3.5}
ALL = [getattr(errors, name) for name in errors.__all__]


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_pickle_round_trip_keeps_message_key_and_holder(cls: type[errors.LockError]) -> None:
    error = cls("held by t-1", "p:{t:abc}", HOLDER)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert (str(copy), copy.key, copy.holder) == ("held by t-1", "p:{t:abc}", HOLDER)


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_celery_json_result_round_trip_keeps_type_and_holder(cls: type[errors.LockError]) -> None:
    backend = BaseBackend(Celery(set_as_current=False), serializer="json")
    error = cls("held by t-1", "p:{t:abc}", HOLDER)
    stored = backend.prepare_exception(error, serializer="json")
    rebuilt = backend.exception_to_python(stored)
    assert type(rebuilt).__name__ == cls.__name__
    assert str(rebuilt) == "held by t-1"
    assert rebuilt.holder == HOLDER


def test_every_error_is_a_lock_error() -> None:
    assert all(issubclass(cls, errors.LockError) for cls in ALL)


def test_skipped_is_a_duplicate_task_error() -> None:
    assert issubclass(errors.DuplicateTaskSkipped, errors.DuplicateTaskError)
