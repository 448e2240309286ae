"""The read-only inspection CLI, against a real Redis."""

from __future__ import annotations

import redis
from click.testing import CliRunner

from celery_singleton_lock.celery.cli import main
from celery_singleton_lock.engine import Owner, RedisLocker, Renewer
from celery_singleton_lock.testing import RedisServer


def _locker(server: RedisServer) -> RedisLocker:
    return RedisLocker(server.client(), prefix="singleton-lock", renewer=Renewer(autostart=False))


def test_list_shows_every_held_lock_with_its_holder(redis_server: RedisServer) -> None:
    locker = _locker(redis_server)
    locker.try_acquire("app.job:aa", 30, owner=Owner(task_id="t-1", host="w1", pid=11))
    locker.try_acquire(
        "app.job:bb", 30, owner=Owner(task_id="t-2", host="w2", pid=22), fencing=True
    )
    result = CliRunner().invoke(main, ["--url", redis_server.url, "list"])
    assert result.exit_code == 0, result.output
    assert "singleton-lock:{app.job:aa}  task=t-1  host=w1  pid=11" in result.output
    assert "task=t-2" in result.output and "fence=1" in result.output
    assert "2 lock(s) held" in result.output


def test_show_of_a_free_lock_exits_non_zero(redis_server: RedisServer) -> None:
    result = CliRunner().invoke(main, ["--url", redis_server.url, "show", "app.job:zz"])
    assert result.exit_code == 1
    assert "free" in result.output


def test_show_accepts_the_full_key(redis_server: RedisServer) -> None:
    _locker(redis_server).try_acquire("app.job:cc", 30, owner=Owner(task_id="t-3"))
    result = CliRunner().invoke(
        main, ["--url", redis_server.url, "show", "singleton-lock:{app.job:cc}"]
    )
    assert result.exit_code == 0 and "task=t-3" in result.output


def test_an_unreachable_server_is_a_clear_error(redis_server: RedisServer) -> None:
    url = redis_server.url
    redis_server.stop()
    result = CliRunner().invoke(main, ["--url", url, "list"])
    assert result.exit_code != 0
    assert "lock server unavailable" in result.output


def test_the_cli_only_reads(redis_server: RedisServer) -> None:
    client: redis.Redis = redis_server.client()
    _locker(redis_server).try_acquire("app.job:dd", 30)
    before = {k: client.pttl(k) for k in client.scan_iter()}
    CliRunner().invoke(main, ["--url", redis_server.url, "list"])
    after = {k: client.pttl(k) for k in client.scan_iter()}
    assert before.keys() == after.keys()
