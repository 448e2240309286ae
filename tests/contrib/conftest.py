"""A psycopg connection to a schema of each test's own holding the business table
``accounts`` (see ``tests.postgres_support.accounts_schema``)."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from tests.postgres_support import accounts_schema


@pytest.fixture
def schema_url() -> Iterator[str]:
    with accounts_schema() as url:
        yield url


def connect(url: str, **options: Any) -> Any:
    """A psycopg connection whose ``search_path`` is the test's schema."""
    import psycopg

    base, schema = url.rsplit("?schema=", 1)
    return psycopg.connect(base, options=f"-c search_path={schema}", **options)


@pytest.fixture
def db(schema_url: str) -> Iterator[Any]:
    """An autocommit connection to the test's schema."""
    connection = connect(schema_url, autocommit=True)
    yield connection
    connection.close()
