"""Pydantic models as arguments of ``pydantic=True`` tasks, on a real worker: the lock named at
``delay()`` from the caller's model is the one the worker takes from the message (a dict under
JSON, the model itself under pickle), and ``lock_on`` paths reach into the model."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.celery.conftest import lock_key_of
from tests.celery.tasks import core, models

pytest.importorskip("pydantic")  # models' tasks exist only with it


def locks_taken(key: str) -> list[str]:
    return [lock.decode() for lock in core.store().lrange(f"locks:{key}", 0, -1)]


def test_an_equal_model_sent_again_gets_the_queued_calls_result(
    worker: Any, unique_key: str
) -> None:
    customer = uuid.uuid4()
    first = models.place_order.delay(models.order_of(customer), unique_key)
    second = models.place_order.delay(models.order_of(customer), unique_key)
    core.open_gate(unique_key)
    assert second.id == first.id
    assert first.get(timeout=20) == first.id


def test_a_different_model_is_a_different_call(worker: Any, unique_key: str) -> None:
    customer = uuid.uuid4()
    first = models.place_order.delay(models.order_of(customer, "1"), unique_key)
    second = models.place_order.delay(models.order_of(customer, "2"), unique_key)
    core.open_gate(unique_key, 2)
    assert second.id != first.id
    assert {first.get(timeout=20), second.get(timeout=20)} == {first.id, second.id}


@pytest.mark.parametrize("serializer", ["json", "pickle"])
def test_the_worker_takes_the_lock_named_from_the_model_at_the_caller(
    worker: Any, unique_key: str, serializer: str
) -> None:
    order = models.order_of(uuid.uuid4())
    result = models.place_order.apply_async((order, unique_key), serializer=serializer)
    core.open_gate(unique_key)
    assert result.get(timeout=20) == result.id
    assert locks_taken(unique_key) == [lock_key_of(models.place_order, order, unique_key)]


def test_a_lock_on_path_into_the_model_dedupes_other_amounts_of_one_customer(
    worker: Any, unique_key: str
) -> None:
    customer = uuid.uuid4()
    first = models.bill_customer.delay(models.order_of(customer, "1"), unique_key)
    second = models.bill_customer.delay(models.order_of(customer, "2"), unique_key)
    core.open_gate(unique_key)
    assert second.id == first.id
    assert first.get(timeout=20) == first.id
    expected = lock_key_of(models.bill_customer, models.order_of(customer, "3"), unique_key)
    assert locks_taken(unique_key) == [expected]
