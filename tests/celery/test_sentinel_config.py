"""A Sentinel lock URL: how it is chosen, checked and turned into a client (no server needed,
except for the worker-start refusal, which runs a real ``celery worker``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from celery_singleton_lock.celery.config.sentinel import (
    SentinelMasterConnection,
    SentinelMasterSSLConnection,
)
from celery_singleton_lock.celery.config.servers import (
    choose_url,
    close_client,
    make_client,
    transport_options,
)
from celery_singleton_lock.celery.config.urls import redact
from celery_singleton_lock.errors import LockConfigurationError
from celery_singleton_lock.testing import RedisServer
from tests.celery.test_worker_start import EX_CONFIG, broker, run_worker  # noqa: F401

SENTINELS = "sentinel://:secret@10.0.0.1:26379/3;sentinel://10.0.0.2:26380;sentinel://10.0.0.3"
MASTER = {"master_name": "mymaster"}


def test_a_sentinel_broker_is_inherited_with_all_its_sentinels() -> None:
    conf = {"broker_url": SENTINELS, "broker_transport_options": MASTER}
    assert choose_url(conf) == (SENTINELS, "broker_url")


def test_a_sentinel_broker_given_as_a_list_is_inherited_whole() -> None:
    parts = SENTINELS.split(";")
    conf = {"broker_url": parts, "broker_transport_options": MASTER}
    assert choose_url(conf) == (SENTINELS, "broker_url")


def test_an_inherited_broker_url_brings_the_broker_transport_options() -> None:
    conf = {"broker_url": SENTINELS, "broker_transport_options": {"master_name": "b"}}
    assert transport_options(conf, "broker_url")["master_name"] == "b"


def test_an_inherited_backend_url_brings_the_backend_transport_options() -> None:
    conf = {
        "broker_url": "amqp://x//",
        "result_backend": SENTINELS,
        "result_backend_transport_options": {"master_name": "r"},
    }
    _url, source = choose_url(conf)
    assert source == "result_backend"
    assert transport_options(conf, source)["master_name"] == "r"


def test_singleton_lock_transport_options_win_over_the_inherited_ones() -> None:
    conf = {
        "broker_url": SENTINELS,
        "broker_transport_options": {"master_name": "b"},
        "singleton_lock_transport_options": {"master_name": "locks"},
    }
    assert transport_options(conf, "broker_url")["master_name"] == "locks"


def test_an_explicit_sentinel_url_without_a_master_name_names_the_setting_to_set() -> None:
    with pytest.raises(LockConfigurationError) as caught:
        choose_url({"singleton_lock_url": SENTINELS})
    assert "singleton_lock_transport_options = {'master_name'" in caught.value.message
    assert "secret" not in caught.value.message


def test_an_inherited_sentinel_url_without_a_master_name_names_the_broker_options() -> None:
    with pytest.raises(LockConfigurationError) as caught:
        choose_url({"broker_url": SENTINELS})
    assert caught.value.message.startswith("broker_url: ")
    assert "broker_transport_options = {'master_name'" in caught.value.message


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("sentinel://h:1;redis://h:2", "is not sentinel://host:port"),
        ("sentinel://h:port", "is invalid"),
        ("sentinel://h:1/abc", "database 'abc' is not a number"),
        ("sentinel://h:1?ssl=true", "has a query string"),
        ("sentinel://:1", "is not sentinel://host:port"),
    ],
)
def test_a_malformed_sentinel_url_is_refused_saying_which_part(url: str, words: str) -> None:
    with pytest.raises(LockConfigurationError, match=words):
        choose_url({"singleton_lock_url": url, "singleton_lock_transport_options": MASTER})


def test_every_sentinel_password_is_redacted() -> None:
    shown = redact("sentinel://:a@h1:1;sentinel://u:b@h2:2")
    assert shown == "sentinel://:***@h1:1;sentinel://u:***@h2:2"


@pytest.fixture
def client() -> Any:
    made = make_client(SENTINELS, {}, {**MASTER, "sentinel_kwargs": {"password": "s"}})
    yield made
    close_client(made)


def test_the_client_follows_the_named_master_through_the_sentinels(client: Any) -> None:
    pool = client.connection_pool
    assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
    assert pool.service_name == "mymaster"
    assert [
        (s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
        for s in pool.sentinel_manager.sentinels
    ] == [("10.0.0.1", 26379), ("10.0.0.2", 26380), ("10.0.0.3", 26379)]


def test_db_and_password_of_the_first_part_are_the_masters(client: Any) -> None:
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["db"], kwargs["password"]) == (3, "secret")


def test_the_sentinel_connections_keep_the_client_timeouts_with_sentinel_kwargs(
    client: Any,
) -> None:
    kwargs = client.connection_pool.sentinel_manager.sentinels[0].connection_pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["password"]) == (5.0, "s")


def test_the_master_connections_ask_the_sentinels_at_every_reconnection(client: Any) -> None:
    assert client.connection_pool.connection_class is SentinelMasterConnection


def test_ssl_in_the_redis_options_gives_tls_connections_to_the_master() -> None:
    made = make_client(SENTINELS, {"ssl": True}, MASTER)
    try:
        assert made.connection_pool.connection_class is SentinelMasterSSLConnection
    finally:
        close_client(made)


def test_a_worker_with_a_sentinel_url_and_no_master_name_is_refused_in_one_line(
    tmp_path: Path,
    broker: RedisServer,  # noqa: F811
) -> None:
    outcome = run_worker(
        tmp_path, broker, "solo", before=f"app.conf.singleton_lock_url = {SENTINELS!r}"
    )
    assert outcome.returncode == EX_CONFIG, outcome.output
    lines = [line for line in outcome.output.splitlines() if "master_name" in line]
    assert len(lines) == 1 and "CRITICAL" in lines[0], outcome.output
    assert "Traceback" not in outcome.output
