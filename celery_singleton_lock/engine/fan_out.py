"""Asking the independent servers of a Redlock quorum at once, and counting their answers.

A :class:`FanOut` is what :class:`~.redlock.QuorumLocker` and its inspector share: one
:class:`~.locker.RedisLocker` per server, a small thread pool that calls each at once, and the
majority that must answer.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, Optional, Sequence, TypeVar

from celery_singleton_lock.engine.fork_safety import reset_in_forked_children
from celery_singleton_lock.errors import LockBackendUnavailable

if TYPE_CHECKING:
    from celery_singleton_lock.engine.locker import RedisLocker

T = TypeVar("T")


def majority(count: int) -> int:
    return count // 2 + 1


class FanOut:
    """Calls on every one of ``servers`` at once, from a thread pool of its own."""

    def __init__(self, servers: list[RedisLocker]) -> None:
        #: one locker per server, in the order given
        self.servers = servers
        #: how many servers must agree
        self.quorum = majority(len(servers))
        self._pool: Optional[ThreadPoolExecutor] = None
        self._pool_lock = threading.Lock()
        reset_in_forked_children(self)

    def after_fork_in_child(self) -> None:
        # The parent's pool threads do not exist in a child: a new pool is made on first use.
        self._pool = None
        self._pool_lock = threading.Lock()

    def each(self, call: Callable[[RedisLocker], T]) -> list[Future[T]]:
        """``call(server)`` for every server at once, from the thread pool."""
        pool = self._pool
        if pool is None:
            with self._pool_lock:
                pool = self._pool
                if pool is None:
                    # two threads a server: a renewal tick never queues behind acquires
                    pool = self._pool = ThreadPoolExecutor(
                        max_workers=2 * len(self.servers), thread_name_prefix="csl-quorum"
                    )
        try:
            return [pool.submit(call, server) for server in self.servers]
        except RuntimeError:  # the interpreter is exiting (atexit): the pool takes no work
            return [_called(call, server) for server in self.servers]

    def answers(self, futures: Sequence[Future[T]], key: str) -> list[Optional[T]]:
        """The replies of ``futures`` in server order (None where a server did not answer);
        ``LockBackendUnavailable`` when fewer than a majority answered."""
        replies: list[Optional[T]] = []
        failures: list[str] = []
        for future in futures:
            try:
                replies.append(future.result())
            except LockBackendUnavailable as exc:
                replies.append(None)
                failures.append(exc.message)
        answered = len(futures) - len(failures)
        if answered < self.quorum:
            raise LockBackendUnavailable(
                f"only {answered} of {len(futures)} lock servers answered about {key}, "
                f"{self.quorum} needed ({'; '.join(failures)})",
                key,
            )
        return replies

    def close(self) -> None:
        """Stop the pool (calls not yet started are dropped) and close every server's
        connections."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        for server in self.servers:
            server.close()


def _called(call: Callable[[RedisLocker], T], server: RedisLocker) -> Future[T]:
    """``call(server)`` made here, as a finished future (each server in turn, not at once)."""
    future: Future[T] = Future()
    try:
        future.set_result(call(server))
    except Exception as exc:  # noqa: BLE001 - handed to the caller as the future's error
        future.set_exception(exc)
    return future
