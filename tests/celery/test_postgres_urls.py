"""PostgreSQL lock URLs in libpq's multi-host form (``host1:port1,host2:port2``, with
``target_session_attrs=read-write`` to follow a failover: tests/chaos/test_postgres_failover.py)."""

from __future__ import annotations

import pytest

from celery_singleton_lock.celery.config.servers import check_url
from celery_singleton_lock.errors import LockConfigurationError

pytest.importorskip("psycopg")  # the oldest corner installs no psycopg

from celery_singleton_lock.engine.postgres.connections import where

MULTI = "postgresql://u:pw@10.0.0.1:5432,10.0.0.2:5433/app?target_session_attrs=read-write"


def test_a_multi_host_postgresql_url_is_accepted() -> None:
    assert check_url(MULTI) == MULTI


def test_a_multi_host_postgresql_url_with_a_bad_port_in_any_host_is_refused() -> None:
    with pytest.raises(LockConfigurationError, match="invalid"):
        check_url("postgresql://u@10.0.0.1:5432,10.0.0.2:nope/app")


def test_messages_name_every_host_of_a_multi_host_url_and_no_password() -> None:
    assert where(MULTI) == "10.0.0.1:5432,10.0.0.2:5433/app"
