"""The package's connections name themselves (``CLIENT SETNAME``), so ``CLIENT LIST`` on the
lock server shows which host and process holds them."""

from __future__ import annotations

import os
import socket
from typing import Any

import redis

from celery_singleton_lock.celery.config.servers import client_name, make_client
from celery_singleton_lock.testing import RedisServer
from tests.celery.tasks import policies


def _names(server_client: redis.Redis) -> set[str]:
    return {str(entry.get("name") or "") for entry in server_client.client_list()}


def test_the_name_says_the_package_the_host_and_the_pid() -> None:
    assert client_name() == f"celery-singleton-lock:{socket.gethostname()}:{os.getpid()}"


def test_a_client_the_package_makes_names_its_connections(redis_server: RedisServer) -> None:
    client = make_client(redis_server.url)
    try:
        client.ping()
        assert client_name() in _names(redis_server.client())
    finally:
        client.close()


def test_the_redis_options_can_name_the_connections_otherwise(redis_server: RedisServer) -> None:
    client = make_client(redis_server.url, {"client_name": "billing-locks"})
    try:
        client.ping()
        assert "billing-locks" in _names(redis_server.client())
    finally:
        client.close()


def test_a_workers_lock_connections_are_listed_under_the_package_name(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    policies.hold_skip.delay(unique_key).get(timeout=10)
    # the in-process worker runs its bodies in this process
    assert client_name() in _names(store)
