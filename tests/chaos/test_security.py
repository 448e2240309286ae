"""Security checks: random tokens, ownership, least-privilege ACL, no unpickling."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator

import pytest
import redis
from celery import Celery

import celery_singleton_lock
from celery_singleton_lock import LockedTask
from celery_singleton_lock.celery.config.lockers import forget_locker
from celery_singleton_lock.engine import Lease, Owner, RedisLocker, Renewer
from celery_singleton_lock.engine.waiting import subscribe_releases, wait_for_release
from celery_singleton_lock.testing import RedisServer

PACKAGE = Path(celery_singleton_lock.__file__).parent


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer.running() as server:
        yield server


def test_tokens_are_128_bit_and_never_repeat(server: RedisServer) -> None:
    locker = RedisLocker(server.client(), renewer=Renewer(autostart=False))
    tokens = set()
    for i in range(2000):
        lease = locker.try_acquire(f"job-{i}", 30, renew=False)
        assert isinstance(lease, Lease)
        assert len(lease.token) == 32 and int(lease.token, 16) >= 0
        tokens.add(lease.token)
    assert len(tokens) == 2000


def test_a_client_with_another_token_can_neither_release_nor_renew(server: RedisServer) -> None:
    mine = RedisLocker(server.client(), renewer=Renewer(autostart=False))
    lease = mine.try_acquire("job", 30, renew=False)
    assert isinstance(lease, Lease)
    theirs = RedisLocker(server.client(), renewer=Renewer(autostart=False))
    forged = Lease(
        locker=theirs,
        keys=lease.keys,
        token="0123456789abcdef" * 2,
        ttl=600,
        owner=Owner(),
        fence=None,
        confirmed_at=0.0,
        deadline=None,
    )
    assert theirs.release(forged) is False
    assert theirs.renew_batch([forged], now=0.0) == [0]
    assert 0 < server.client().pttl(lease.key) <= 30_000
    assert lease.release() is True


def test_an_acl_user_limited_to_the_lock_prefix_can_run_everything(server: RedisServer) -> None:
    admin: redis.Redis = server.client()
    admin.execute_command(
        "ACL",
        "SETUSER",
        "locker",
        "on",
        ">s3cret",
        "resetkeys",
        "~singleton-lock:*",
        "resetchannels",
        "&singleton-lock:*",
        "+@all",
        "-@dangerous",
        "+scan",
    )
    admin.set("payroll", "secret")
    url = f"redis://locker:s3cret@127.0.0.1:{server.port}/0"
    limited: redis.Redis = redis.Redis.from_url(url)
    with pytest.raises(redis.exceptions.NoPermissionError):
        limited.get("payroll")  # the user really is confined to the prefix

    app = Celery("acl", set_as_current=False, broker="memory://")
    app.conf.singleton_lock_url = url

    def job(account_id: int) -> int:
        return account_id

    task = app.task(
        name="acl.job",
        base=LockedTask,
        shared=False,
        lock_fencing=True,
        on_duplicate="wait",
        lock_wait_timeout=1,
    )(job)
    try:
        assert task.apply(args=(1,)).get() == 1
        name = task.lock_options.keyer.name((1,), {})
        locker = task.lock_locker
        lease = locker.try_acquire(name, 5, fencing=True)  # fence, renew, read, scan, wait
        assert isinstance(lease, Lease) and lease.fence == 2
        assert locker.renew_batch([lease], now=0.0) == []
        assert [h.key for h in locker.inspect.scan()] == [lease.key]
        assert locker.inspect.read(name) is not None
        pubsub = subscribe_releases(locker.client, locker.keys(name).channel)
        lease.release()
        assert wait_for_release(pubsub, 2.0)
        pubsub.close()
    finally:
        forget_locker(app)


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _loads_calls(path: Path) -> set[str]:
    """What ``X.loads(...)`` / ``loads(...)`` calls in ``path`` are made on (``json``...)."""
    called: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "loads":
                called.add(ast.unparse(func.value))
            elif isinstance(func, ast.Name) and func.id == "loads":
                called.add("loads")
    return called


def test_nothing_read_from_redis_is_ever_unpickled() -> None:
    unsafe = {"pickle", "cPickle", "dill", "marshal", "shelve", "jsonpickle"}
    for path in PACKAGE.rglob("*.py"):
        assert not (_imported_modules(path) & unsafe), f"{path} imports a deserializer"
        # json cannot run code (the CLI reads --args as JSON); anything else could
        assert _loads_calls(path) <= {"json"}, f"{path} deserializes something"
