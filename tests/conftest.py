from __future__ import annotations

import socket
from typing import Iterator

import pytest
import redis

from celery_singleton_lock.testing import RedisServer


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--full", action="store_true", help="run full-size chaos scenarios")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--full"):
        return
    skip = pytest.mark.skip(reason="full-size run: pass --full")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh redis-server of this test's own, on a free loopback port."""
    with RedisServer.running() as server:
        yield server


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client(socket_timeout=5, socket_connect_timeout=2)
    yield client
    client.close()


def rabbitmq_available() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=0.5):
            return True
    except OSError:
        return False
