"""Tasks of ``pydantic=True`` whose arguments are pydantic models
(tests/celery/test_pydantic_arguments.py); registered only where pydantic is installed.

The bodies record the lock they hold in ``locks:<key>`` and wait for their gate, so a test can
send a duplicate while the first call is queued or running, then compare the worker's lock
with the one named at the caller.
"""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

from celery_singleton_lock import LockedTask
from tests.celery.tasks.core import app, gated_body, store

try:
    from pydantic import BaseModel
except ImportError:  # pragma: no cover - the oldest corner's venv has no pydantic
    BaseModel = None  # type: ignore[assignment,misc]


def record_lock(task: LockedTask, key: str) -> str:
    lease = task.request.lock.lease
    store().rpush(f"locks:{key}", lease.keys.lock if lease is not None else "")
    return gated_body(key, task.request.id)


if BaseModel is not None:

    class Customer(BaseModel):
        id: uuid.UUID
        name: str

    class Order(BaseModel):
        customer: Customer
        amount: Decimal

    @app.task(bind=True, base=LockedTask, pydantic=True, dedupe_on_enqueue=True, lock_ttl=5)
    def place_order(self: LockedTask, order: Order, key: str) -> str:
        return record_lock(self, key)

    @app.task(
        bind=True,
        base=LockedTask,
        pydantic=True,
        dedupe_on_enqueue=True,
        lock_ttl=5,
        lock_on=("order.customer.id", "key"),
    )
    def bill_customer(self: LockedTask, order: Order, key: str) -> str:
        return record_lock(self, key)

    def order_of(customer_id: uuid.UUID, amount: str = "9.50") -> Any:
        """A new ``Order`` (built anew each call: equal models, not the same object)."""
        return Order(customer=Customer(id=customer_id, name="Ada"), amount=Decimal(amount))
