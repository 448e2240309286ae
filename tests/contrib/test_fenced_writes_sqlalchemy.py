"""The SQLAlchemy Core helper on the real PostgreSQL (through psycopg 3): an UPDATE
conditional on the lock's fence. Skipped where SQLAlchemy is not installed (extra
``[sqlalchemy]``, part of ``dev``)."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from celery_singleton_lock.errors import StaleFenceError

sqlalchemy = pytest.importorskip(
    "sqlalchemy", reason="SQLAlchemy is not installed: pip install -e '.[dev]' (extra sqlalchemy)"
)
pytest.importorskip("psycopg")

from celery_singleton_lock.contrib.fencing.sqlalchemy import fenced_update  # noqa: E402


@pytest.fixture
def engine_and_table(schema_url: str) -> Iterator[tuple[Any, Any]]:
    base, schema = schema_url.rsplit("?schema=", 1)
    engine = sqlalchemy.create_engine(base.replace("postgresql://", "postgresql+psycopg://", 1))
    accounts = sqlalchemy.Table(
        "accounts",
        sqlalchemy.MetaData(schema=schema),
        sqlalchemy.Column("id", sqlalchemy.Integer, primary_key=True),
        sqlalchemy.Column("balance", sqlalchemy.Integer, nullable=False),
        sqlalchemy.Column("fence", sqlalchemy.BigInteger, nullable=True),
    )
    yield engine, accounts
    engine.dispose()


def row(connection: Any, accounts: Any, account_id: int) -> tuple[int, Any]:
    found = connection.execute(
        sqlalchemy.select(accounts.c.balance, accounts.c.fence).where(accounts.c.id == account_id)
    ).one()
    return int(found[0]), found[1]


def test_a_newer_fence_updates_the_row_and_stores_the_fence(
    engine_and_table: tuple[Any, Any],
) -> None:
    engine, accounts = engine_and_table
    with engine.begin() as conn:
        updated = fenced_update(
            conn, accounts, accounts.c.id == 1, {"balance": accounts.c.balance + 10}, 6
        )
        assert updated == 1
        assert row(conn, accounts, 1) == (10, 6)


def test_an_older_fence_is_refused_and_writes_nothing(engine_and_table: tuple[Any, Any]) -> None:
    engine, accounts = engine_and_table
    with pytest.raises(StaleFenceError) as refused, engine.begin() as conn:
        fenced_update(conn, accounts, accounts.c.id == 1, {"balance": 10}, 4)
    assert (refused.value.fence, refused.value.seen) == (4, 5)
    with engine.connect() as conn:
        assert row(conn, accounts, 1) == (0, 5)


def test_a_row_never_written_under_a_lock_takes_any_fence(
    engine_and_table: tuple[Any, Any],
) -> None:
    engine, accounts = engine_and_table
    with engine.begin() as conn:
        fenced_update(conn, accounts, accounts.c.id == 2, {"balance": 3}, 1)
        assert row(conn, accounts, 2) == (3, 1)


def test_no_matching_row_raises_no_result_found(engine_and_table: tuple[Any, Any]) -> None:
    engine, accounts = engine_and_table
    with pytest.raises(sqlalchemy.exc.NoResultFound), engine.begin() as conn:
        fenced_update(conn, accounts, accounts.c.id == 99, {"balance": 1}, 7)
