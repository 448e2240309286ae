"""The PostgreSQL the tests use (127.0.0.1:5432, trust auth, database ``test``; the
``CSL_POSTGRES_URL`` environment variable overrides it): a schema of each test's own, dropped
after it, and a skip when no server answers."""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import Iterator

import pytest

BASE_URL = os.environ.get("CSL_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


@contextlib.contextmanager
def postgres_schema() -> Iterator[str]:
    """The lock URL of a fresh schema (``?schema=t_<hex>``), dropped at the end."""
    psycopg = pytest.importorskip("psycopg")
    try:
        admin = psycopg.connect(BASE_URL, autocommit=True, connect_timeout=2)
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL at {BASE_URL}: {exc}")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    separator = "&" if "?" in BASE_URL else "?"
    try:
        yield f"{BASE_URL}{separator}schema={schema}"
    finally:
        admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        admin.close()


@contextlib.contextmanager
def accounts_schema() -> Iterator[str]:
    """The lock URL of a fresh schema that exists and holds a business table ``accounts``
    (``id``, ``balance``, ``fence``) with accounts 1 (fence 5) and 2 (fence NULL: never
    written under a lock), for the fenced-write helpers; dropped at the end."""
    psycopg = pytest.importorskip("psycopg")
    with postgres_schema() as url:
        base, schema = url.rsplit("?schema=", 1)
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f"CREATE SCHEMA {schema}")
            admin.execute(
                f"CREATE TABLE {schema}.accounts "
                "(id integer PRIMARY KEY, balance integer NOT NULL, fence bigint)"
            )
            admin.execute(f"INSERT INTO {schema}.accounts VALUES (1, 0, 5), (2, 0, NULL)")
        yield url
