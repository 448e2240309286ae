"""Pydantic models as arguments and dotted ``lock_on`` paths (``"order.customer_id"``)."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from celery_singleton_lock.arguments import ArgumentKeyer
from celery_singleton_lock.errors import LockConfigurationError, LockKeyError

pydantic = pytest.importorskip("pydantic")

TASK = "tasks.bill"


class Customer(pydantic.BaseModel):  # type: ignore[misc,name-defined]
    id: uuid.UUID
    since: dt.date


class Order(pydantic.BaseModel):  # type: ignore[misc,name-defined]
    customer: Customer
    amount: float


def bill(order: Any, note: Any = None) -> None: ...


SEVEN = uuid.UUID(int=7)


def order_of(amount: float = 1.5, customer: uuid.UUID = SEVEN) -> Any:
    return Order(customer=Customer(id=customer, since=dt.date(2024, 1, 2)), amount=amount)


def as_received(model: Any) -> Any:
    """The model as a JSON message brings it to the worker."""
    return json.loads(json.dumps(model.model_dump(mode="json")))


def test_a_model_and_its_json_dump_name_the_same_lock() -> None:
    keyer = ArgumentKeyer(TASK, bill)
    assert keyer.name((order_of(),), {}) == keyer.name((as_received(order_of()),), {})


def test_a_model_keyword_and_positional_name_the_same_lock() -> None:
    keyer = ArgumentKeyer(TASK, bill)
    assert keyer.name((), {"order": order_of()}) == keyer.name((order_of(), None), {})


def test_models_with_different_fields_name_different_locks() -> None:
    keyer = ArgumentKeyer(TASK, bill)
    assert keyer.name((order_of(1.0),), {}) != keyer.name((order_of(2.0),), {})


def test_a_path_through_a_model_matches_the_path_through_its_dump() -> None:
    keyer = ArgumentKeyer(TASK, bill, lock_on=("order.customer.id",))
    assert keyer.name((order_of(),), {}) == keyer.name((as_received(order_of()),), {})


def test_a_path_ignores_the_rest_of_the_argument() -> None:
    keyer = ArgumentKeyer(TASK, bill, lock_on=("order.customer.id",))
    assert keyer.name((order_of(1.0),), {"note": 1}) == keyer.name((order_of(2.0),), {})


def test_a_path_still_tells_different_values_apart() -> None:
    keyer = ArgumentKeyer(TASK, bill, lock_on=("order.customer.id",))
    other = order_of(customer=uuid.UUID(int=8))
    assert keyer.name((order_of(),), {}) != keyer.name((other,), {})


def test_a_path_reads_attributes_of_plain_objects() -> None:
    keyer = ArgumentKeyer(TASK, bill, lock_on=("order.customer_id",))
    assert keyer.name((SimpleNamespace(customer_id=3),), {}) == keyer.name(
        ({"customer_id": 3},), {}
    )


def test_a_path_names_another_lock_than_its_parameter() -> None:
    by_path = ArgumentKeyer(TASK, bill, lock_on=("order.x",))
    by_parameter = ArgumentKeyer(TASK, bill, lock_on=("order",))
    assert by_path.name(({"x": 1},), {}) != by_parameter.name((1,), {})


def test_a_path_whose_head_is_not_a_parameter_is_refused_at_registration() -> None:
    with pytest.raises(LockConfigurationError) as info:
        ArgumentKeyer(TASK, bill, lock_on=("ordr.customer.id",))
    message = info.value.message
    assert TASK in message and "lock_on" in message and "'ordr.customer.id'" in message
    assert "name existing parameters" in message


def test_a_call_without_the_paths_key_names_the_task_and_path() -> None:
    keyer = ArgumentKeyer(TASK, bill, lock_on=("order.customer.id",))
    with pytest.raises(LockKeyError) as info:
        keyer.name(({"customer": {}},), {})
    assert TASK in info.value.message and "'order.customer.id'" in info.value.message


def test_the_keyer_does_not_import_pydantic() -> None:
    script = (
        "import sys\n"
        "from celery_singleton_lock.arguments import ArgumentKeyer\n"
        "def f(x): ...\n"
        "ArgumentKeyer('t', f, lock_on=('x.y',)).name(({'y': 1},), {})\n"
        "print('pydantic' in sys.modules)\n"
    )
    output = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert output.strip() == "False"
