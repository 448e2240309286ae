"""Fenced writes with SQLAlchemy Core (extra ``[sqlalchemy]``), in the caller's transaction.

:func:`fenced_update` is ``UPDATE table SET ..., fence = F WHERE <where> AND (fence IS NULL OR
fence <= F)``: the business row carries a fence column, and a holder whose fence is lower than
the one written last has its write refused by the database. Works on a ``Connection`` or a
``Session`` (the statement joins its transaction), on any database SQLAlchemy speaks.
"""

from __future__ import annotations

from typing import Any, Mapping

import sqlalchemy

from celery_singleton_lock.contrib.fencing import checked_fence, stale

__all__ = ["fenced_update"]


def fenced_update(
    connection: Any,
    table: Any,
    where: Any,
    values: Mapping[str, Any],
    fence: int,
    *,
    fence_column: str = "fence",
) -> int:
    """Set ``values`` (and ``fence_column`` to ``fence``) on the rows of ``table`` (a
    ``Table``) matching ``where`` (a SQL expression, e.g. ``accounts.c.id == 7``), unless a
    row carries a fence above ``fence``. Values may be expressions
    (``accounts.c.balance + 5``).

    Returns the number of rows updated (at least 1). Raises ``StaleFenceError`` when the rows
    matched carry a higher fence (nothing written), ``sqlalchemy.exc.NoResultFound`` when no
    row matches. A ``NULL`` fence (a row never written under a lock) counts as lowest.
    """
    fence = checked_fence(fence)
    if fence_column in values:
        raise ValueError(f"{fence_column!r} is set by fenced_update: leave it out of values")
    column = table.c[fence_column]
    statement = (
        sqlalchemy.update(table)
        .where(where)
        .where(sqlalchemy.or_(column.is_(None), column <= fence))
        .values({**values, fence_column: fence})
    )
    updated = int(connection.execute(statement).rowcount)
    if updated > 0:
        return updated
    seen, matched = connection.execute(
        sqlalchemy.select(sqlalchemy.func.max(column), sqlalchemy.func.count()).where(where)
    ).one()
    what = f"{table.name} where {where}"
    if not matched:
        raise sqlalchemy.exc.NoResultFound(f"fenced_update: no row of {what}")
    raise stale(what, fence, seen)
