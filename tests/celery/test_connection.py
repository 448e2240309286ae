"""Which Redis holds the locks (pure functions)."""

from __future__ import annotations

import pytest

from celery_singleton_lock.celery.config.servers import choose_url
from celery_singleton_lock.celery.config.urls import redact


def test_explicit_url_wins() -> None:
    conf = {"singleton_lock_url": "rediss://u:p@h:6380/2", "broker_url": "redis://b/0"}
    assert choose_url(conf) == ("rediss://u:p@h:6380/2", "singleton_lock_url")


@pytest.mark.parametrize("broker", ["redis://b:6379/0", "rediss://b/0", "unix:///tmp/r.sock"])
def test_redis_broker_is_the_default(broker: str) -> None:
    assert choose_url({"broker_url": broker}) == (broker, "broker_url")


def test_redis_result_backend_is_used_when_the_broker_is_not_redis() -> None:
    conf = {"broker_url": "amqp://guest@rabbit//", "result_backend": "redis://r/1"}
    assert choose_url(conf) == ("redis://r/1", "result_backend")


def test_localhost_is_the_last_resort() -> None:
    assert choose_url({"broker_url": "amqp://x//"}) == ("redis://localhost:6379/0", "default")


def test_failover_broker_lists_use_their_first_url() -> None:
    conf = {"broker_url": "redis://a/0;redis://b/0"}
    assert choose_url(conf) == ("redis://a/0", "broker_url")


def test_passwords_are_redacted_in_logs() -> None:
    assert redact("rediss://user:secret@host:6380/0") == "rediss://user:***@host:6380/0"
    assert "secret" not in redact("redis://:secret@host/0")
