"""Lock server down: clear errors, no lease wrongly reported as held."""

from __future__ import annotations

import pytest

from celery_singleton_lock.engine import Lease, RedisLocker, Renewer
from celery_singleton_lock.errors import LockBackendUnavailable, LockError
from celery_singleton_lock.testing import RedisServer


def test_acquire_raises_backend_unavailable_when_the_server_is_down() -> None:
    with RedisServer.running() as server:
        locker = RedisLocker(
            server.client(socket_timeout=0.3, socket_connect_timeout=0.3),
            prefix="t",
            renewer=Renewer(autostart=False),
        )
        server.stop()
        with pytest.raises(LockBackendUnavailable) as info:
            locker.try_acquire("job", ttl=5)
        assert info.value.key == "t:{job}"
        assert isinstance(info.value, LockError)


def test_failed_release_keeps_the_token_so_it_can_be_retried() -> None:
    with RedisServer.running() as server:
        client = server.client(socket_timeout=0.3, socket_connect_timeout=0.3)
        locker = RedisLocker(client, prefix="t", renewer=Renewer(autostart=False))
        lease = locker.try_acquire("job", ttl=30)
        assert isinstance(lease, Lease)
        server.pause()
        try:
            with pytest.raises(LockBackendUnavailable):
                lease.release()
        finally:
            server.resume()
        assert lease.release() is True
        assert locker.read("job") is None


def test_a_key_of_another_type_gives_a_clear_error(redis_server: RedisServer) -> None:
    client = redis_server.client()
    client.set("t:{job}", "not a lock")
    locker = RedisLocker(client, prefix="t", renewer=Renewer(autostart=False))
    with pytest.raises(LockError, match="not a lock written by this package"):
        locker.try_acquire("job", ttl=5)
