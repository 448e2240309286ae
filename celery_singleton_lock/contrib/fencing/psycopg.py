"""Fenced writes with plain psycopg 3 (extra ``[postgres]``), in the caller's transaction.

Two shapes, both refusing a holder whose fence is lower than the last one written:

* :func:`fenced_update`: the business row carries a ``fence`` column;
  ``UPDATE t SET ..., fence = F WHERE <key> AND (fence IS NULL OR fence <= F)``.
* :func:`claim_fence`: a side table keyed by resource holds the last fence (for writes that
  touch several rows or tables, or insert); an upsert that moves it up to ``F`` or refuses.
  The claimed row stays locked until the caller's transaction ends, so a newer holder's claim
  waits for this transaction and then sees its fence.

Each runs one statement on success; a refusal reads the stored fence once more, to say it.
"""

from __future__ import annotations

from typing import Any, Mapping

from psycopg import sql

from celery_singleton_lock.contrib.fencing import checked_fence, stale

__all__ = ["FENCE_TABLE", "claim_fence", "create_fence_table", "fenced_update"]

#: The side table of :func:`claim_fence` (in the connection's ``search_path``).
FENCE_TABLE = "singleton_lock_fences"


def _identifier(name: str) -> sql.Identifier:
    """``"table"`` or ``"schema.table"`` as a quoted identifier."""
    return sql.Identifier(*name.split("."))


def fenced_update(
    connection: Any,
    table: str,
    where: Mapping[str, Any],
    values: Mapping[str, Any],
    fence: int,
    *,
    fence_column: str = "fence",
) -> int:
    """Set ``values`` (and ``fence_column`` to ``fence``) on the rows of ``table`` matching
    ``where`` (column = value, joined by AND), unless a row carries a fence above ``fence``.

    ``connection`` is a psycopg ``Connection`` or ``Cursor``: the statement joins its current
    transaction. Returns the number of rows updated (at least 1). Raises ``StaleFenceError``
    when the rows matched carry a higher fence (nothing written), ``LookupError`` when no row
    matches ``where``. A ``NULL`` fence (a row never written under a lock) counts as lowest.
    """
    fence = checked_fence(fence)
    if not where:
        raise ValueError("fenced_update needs a where= naming the row(s), e.g. {'id': 7}")
    if fence_column in values:
        raise ValueError(f"{fence_column!r} is set by fenced_update: leave it out of values")
    column = sql.Identifier(fence_column)
    condition = sql.SQL(" AND ").join(
        sql.SQL("{} = %s").format(sql.Identifier(name)) for name in where
    )
    assignments = sql.SQL(", ").join(
        sql.SQL("{} = %s").format(sql.Identifier(name)) for name in [*values, fence_column]
    )
    statement = sql.SQL(
        "UPDATE {table} SET {assignments} "
        "WHERE {condition} AND ({column} IS NULL OR {column} <= %s)"
    ).format(table=_identifier(table), assignments=assignments, condition=condition, column=column)
    cursor = connection.execute(statement, [*values.values(), fence, *where.values(), fence])
    updated = int(cursor.rowcount)
    if updated > 0:
        return updated
    row = connection.execute(
        sql.SQL("SELECT max({column}), count(*) FROM {table} WHERE {condition}").format(
            column=column, table=_identifier(table), condition=condition
        ),
        list(where.values()),
    ).fetchone()
    what = f"{table} where " + ", ".join(f"{name}={value!r}" for name, value in where.items())
    if row is None or not row[1]:
        raise LookupError(f"fenced_update: no row of {what}")
    raise stale(what, fence, row[0])


def claim_fence(connection: Any, resource: str, fence: int, *, table: str = FENCE_TABLE) -> None:
    """Move the last fence of ``resource`` up to ``fence`` in ``table``, or refuse.

    Call it first in the transaction that writes the resource: the claimed row stays locked
    until the transaction ends. The same fence passes again (one holder, several writes).
    Raises ``StaleFenceError`` when ``resource`` already carries a higher fence.
    """
    fence = checked_fence(fence)
    name = _identifier(table)
    row = connection.execute(
        sql.SQL(
            "INSERT INTO {table} AS f (resource, fence) VALUES (%s, %s) "
            "ON CONFLICT (resource) DO UPDATE SET fence = excluded.fence "
            "WHERE f.fence <= excluded.fence RETURNING fence"
        ).format(table=name),
        [resource, fence],
    ).fetchone()
    if row is not None:
        return
    seen = connection.execute(
        sql.SQL("SELECT fence FROM {table} WHERE resource = %s").format(table=name), [resource]
    ).fetchone()
    raise stale(resource, fence, seen[0] if seen else None)


def create_fence_table(connection: Any, table: str = FENCE_TABLE) -> None:
    """Create :func:`claim_fence`'s table if it is missing (or create it beforehand::

        CREATE TABLE singleton_lock_fences (resource text PRIMARY KEY, fence bigint NOT NULL);
    )."""
    connection.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {table} (resource text PRIMARY KEY, fence bigint NOT NULL)"
        ).format(table=_identifier(table))
    )
