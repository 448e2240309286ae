"""Bad input catalogue: every case gets a clear error naming the task and the cause, and
leaves no lock key behind. Run-time cases go through ``apply()``, which runs the real
``before_start`` lock path against a real Redis."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator

import pytest
import redis
from celery import Celery

from celery_singleton_lock import LockedTask, LockError
from celery_singleton_lock.celery.config.lockers import forget_locker
from celery_singleton_lock.celery.worker.start_checks import check_configuration
from celery_singleton_lock.testing import RedisServer, free_port

TASK = "billing.apply_delta"


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer.running() as server:
        yield server


@pytest.fixture
def app(server: RedisServer) -> Iterator[Celery]:
    app = Celery("bad-input", set_as_current=False, broker="memory://")
    app.conf.singleton_lock_url = server.url
    app.finalize()
    yield app
    forget_locker(app)
    app.close()


def define(app: Celery, **options: Any) -> Any:
    def apply_delta(account_id: Any, cents: int = 0) -> int:
        return cents

    return app.task(name=TASK, base=LockedTask, shared=False, **options)(apply_delta)


def lock_keys(server: RedisServer) -> list[bytes]:
    client: redis.Redis = server.client()
    # a lock key ends with its hash tag: fence counters and finish records are not locks
    return list(client.scan_iter(match="singleton-lock:{*}"))


def run_error(task: Any, *args: Any, **kwargs: Any) -> BaseException:
    result = task.apply(args=args, kwargs=kwargs)
    assert result.state == "FAILURE", f"expected a failure, got {result.state}"
    assert isinstance(result.result, BaseException)
    return result.result


class Unhashable:
    pass


RUN_TIME_CASES: dict[str, tuple[dict[str, Any], tuple[Any, ...], dict[str, Any], list[str]]] = {
    # name: (task options, args, kwargs, words the message must contain)
    "object argument": ({}, (object(),), {}, ["account_id", "builtins.object", "lock_on"]),
    "set argument": ({}, ({1, 2},), {}, ["account_id", "set", "lock_key"]),
    "lambda argument": ({}, (lambda: 1,), {}, ["account_id", "function"]),
    "custom class nested in a dict": (
        {},
        ({"meta": [1, Unhashable()]},),
        {},
        ["account_id['meta'][1]", "Unhashable"],
    ),
    "arguments not matching the signature": ({}, (1, 2, 3), {}, ["signature", "too many"]),
    "unknown keyword argument": ({}, (1,), {"cent": 5}, ["signature", "cent"]),
    "lock_key callable raises": (
        {"lock_key": lambda account_id, cents=0: account_id["id"]},
        (7,),
        {},
        ["lock_key callable raised", "TypeError"],
    ),
    "lock_key callable returns a non-string": (
        {"lock_key": lambda account_id, cents=0: account_id},
        (7,),
        {},
        ["returned int"],
    ),
}


@pytest.mark.parametrize("case", list(RUN_TIME_CASES))
def test_bad_call_fails_clearly_and_takes_no_lock(
    app: Celery, server: RedisServer, case: str
) -> None:
    options, args, kwargs, words = RUN_TIME_CASES[case]
    error = run_error(define(app, **options), *args, **kwargs)
    assert isinstance(error, LockError)
    message = str(error)
    assert TASK in message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    assert lock_keys(server) == []


def test_ten_megabyte_argument_gets_a_bounded_key_and_leaves_no_lock(
    app: Celery, server: RedisServer
) -> None:
    task = define(app)
    big = "x" * (10 * 1024 * 1024)
    assert len(task.lock_locker.keys(task.lock_options.keyer.name((big,), {})).lock) < 200
    assert task.apply(args=(big,)).state == "SUCCESS"
    assert lock_keys(server) == []


REGISTRATION_CASES: dict[str, tuple[dict[str, Any], list[str]]] = {
    "lock_on names a missing parameter": ({"lock_on": ("acount_id",)}, ["lock_on", "acount_id"]),
    "zero TTL": ({"lock_ttl": 0}, ["lock_ttl=0"]),
    "negative TTL": ({"lock_ttl": -5}, ["lock_ttl=-5"]),
    "absurd TTL": ({"lock_ttl": 10**9}, ["lock_ttl", "out of range"]),
    "NaN TTL": ({"lock_ttl": math.nan}, ["lock_ttl"]),
    "TTL as a string": ({"lock_ttl": "15"}, ["lock_ttl", "'15'"]),
    "unknown policy": ({"on_duplicate": "drop"}, ["on_duplicate='drop'"]),
    "both lock_on and lock_key": (
        {"lock_on": ("account_id",), "lock_key": lambda account_id, cents=0: "k"},
        ["not both"],
    ),
    "lock_key not callable": ({"lock_key": "account_id"}, ["lock_key", "callable"]),
    "negative lock-retry budget": ({"lock_max_retries": -1}, ["lock_max_retries"]),
    "zero finished TTL": ({"lock_finished_ttl": 0}, ["lock_finished_ttl=0"]),
    "finished TTL as a string": ({"lock_finished_ttl": "1h"}, ["lock_finished_ttl", "'1h'"]),
    "unknown backend-error policy": (
        {"lock_on_backend_error": "ignore"},
        ["lock_on_backend_error='ignore'"],
    ),
}


@pytest.mark.parametrize("case", list(REGISTRATION_CASES))
def test_bad_option_fails_at_registration(app: Celery, server: RedisServer, case: str) -> None:
    options, words = REGISTRATION_CASES[case]
    with pytest.raises(LockError) as info:
        define(app, **options)
    message = str(info.value)
    assert TASK in message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    assert lock_keys(server) == []


@pytest.mark.parametrize("prefix", ["locks{a}", "two words", "tab\tprefix", "new\nline", ""])
def test_key_prefix_with_odd_characters_fails_at_registration(app: Celery, prefix: str) -> None:
    app.conf.singleton_lock_prefix = prefix
    with pytest.raises(LockError, match=rf"{TASK}.*prefix"):
        define(app)


def _worker_start(app: Celery) -> Callable[[], None]:
    return lambda: check_configuration(app)


def test_misspelt_setting_fails_at_worker_start(app: Celery) -> None:
    app.conf.singleton_lock_on_duplicat = "retry"
    with pytest.raises(LockError, match="singleton_lock_on_duplicat"):
        _worker_start(app)()


def test_non_redis_lock_url_fails_at_worker_start(app: Celery) -> None:
    app.conf.singleton_lock_url = "amqp://guest:secret@localhost//"
    with pytest.raises(LockError, match="not a Redis URL") as info:
        _worker_start(app)()
    assert "secret" not in str(info.value)


def test_unreachable_lock_url_fails_naming_the_task(app: Celery, server: RedisServer) -> None:
    app.conf.singleton_lock_url = f"redis://127.0.0.1:{free_port()}/0"
    error = run_error(define(app), 1)
    assert type(error).__name__ == "LockBackendUnavailable"
    assert TASK in str(error) and "unavailable" in str(error)


def test_wrong_password_fails_naming_the_task_and_the_cause() -> None:
    with RedisServer.running(password="right") as server:
        app = Celery("pw", set_as_current=False, broker="memory://")
        app.conf.singleton_lock_url = f"redis://:wrong@127.0.0.1:{server.port}/0"
        error = run_error(define(app), 1)
        forget_locker(app)
        assert type(error).__name__ == "LockBackendUnavailable"
        assert TASK in str(error)
        assert "password" in str(error).lower() or "WRONGPASS" in str(error)
        assert lock_keys(server) == []


def test_redis_at_maxmemory_refusing_writes_fails_naming_the_task() -> None:
    with RedisServer.running(
        extra_args=["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"]
    ) as server:
        client: redis.Redis = server.client()
        with pytest.raises(redis.exceptions.ResponseError):
            for i in range(10_000):  # fill it up until it refuses
                client.set(f"ballast:{i}", "x" * 10_000)
        app = Celery("oom", set_as_current=False, broker="memory://")
        app.conf.singleton_lock_url = server.url
        error = run_error(define(app), 1)
        forget_locker(app)
        assert type(error).__name__ == "LockBackendUnavailable"
        assert TASK in str(error) and "maxmemory" in str(error)
        assert lock_keys(server) == []


def test_foreign_data_at_the_lock_key_is_a_clear_error(app: Celery, server: RedisServer) -> None:
    task = define(app)
    key = task.lock_locker.keys(task.lock_options.keyer.name((1,), {})).lock
    server.client().set(key, "someone else's data")
    error = run_error(task, 1)
    assert "not a lock written by this package" in str(error)
    assert server.client().get(key) == b"someone else's data"  # left alone
