"""Fenced writes with the Django ORM (extra ``[django]``), in the caller's transaction.

:func:`fenced_update` is ``QuerySet.update`` made conditional on the lock's fence: the model
carries a fence field (``fence = models.BigIntegerField(null=True)``), and a holder whose
fence is lower than the one written last has its write refused by the database::

    fenced_update(Account.objects.filter(pk=account_id), self.request.lock.fence,
                  balance=F("balance") + cents)

Importing this module needs Django installed, but not ``INSTALLED_APPS``: the admin's page of
locks (this package's Django app) is another matter.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Max, Model, Q

from celery_singleton_lock.contrib.fencing import checked_fence, stale

__all__ = ["fenced_update"]


def fenced_update(rows: Any, fence: int, *, fence_field: str = "fence", **values: Any) -> int:
    """``rows.update(**values)`` with ``fence_field`` set to ``fence``, unless a row carries a
    fence above ``fence``.

    ``rows`` is a QuerySet naming the row(s) (``Account.objects.filter(pk=7)``, on any
    database alias) or a model instance (its row, by primary key). Values may be expressions
    (``F("balance") + 5``). Returns the number of rows updated (at least 1). Raises
    ``StaleFenceError`` when the rows matched carry a higher fence (nothing written), the
    model's ``DoesNotExist`` when nothing matches. A ``NULL`` fence counts as lowest.
    """
    fence = checked_fence(fence)
    if fence_field in values:
        raise ValueError(f"{fence_field!r} is set by fenced_update: leave it out of the values")
    if isinstance(rows, Model):
        rows = type(rows)._default_manager.using(rows._state.db).filter(pk=rows.pk)
    newer_or_none = Q(**{f"{fence_field}__isnull": True}) | Q(**{f"{fence_field}__lte": fence})
    updated = int(rows.filter(newer_or_none).update(**values, **{fence_field: fence}))
    if updated > 0:
        return updated
    seen = rows.aggregate(seen=Max(fence_field))["seen"]
    what = f"{rows.model._meta.label} rows of the queryset"
    if seen is None and not rows.exists():
        raise rows.model.DoesNotExist(f"fenced_update: no {what}")
    raise stale(what, fence, seen)
