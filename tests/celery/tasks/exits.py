"""Tasks that end every way Celery lets a task end: raise, retry, ignore, reject, time limits,
a ``__call__`` of their own (tests/celery/test_exit_paths.py, test_real_workers.py); every one
must leave its lock released."""

from __future__ import annotations

import time
from typing import Any

from celery.exceptions import Ignore, Reject

from celery_singleton_lock import LockedTask
from tests.celery.tasks.core import app, body


@app.task(bind=True, base=LockedTask)
def raises(self: LockedTask, key: str) -> None:
    raise ValueError(f"boom {key}")


@app.task(bind=True, base=LockedTask, max_retries=3)
def retries_once(self: LockedTask, key: str) -> str:
    if self.request.retries == 0:
        raise self.retry(countdown=0)
    return "second attempt"


@app.task(
    bind=True,
    base=LockedTask,
    autoretry_for=(KeyError,),
    max_retries=1,
    default_retry_delay=0,
)
def autoretries(self: LockedTask, key: str) -> str:
    if self.request.retries == 0:
        raise KeyError(key)
    return "second attempt"


@app.task(bind=True, base=LockedTask)
def ignores(self: LockedTask, key: str) -> None:
    raise Ignore()


@app.task(bind=True, base=LockedTask)
def rejects(self: LockedTask, key: str) -> None:
    raise Reject("rejected", requeue=False)


@app.task(bind=True, base=LockedTask, soft_time_limit=0.5)
def soft_limited(self: LockedTask, key: str) -> None:
    time.sleep(5)


@app.task(bind=True, base=LockedTask, time_limit=1, lock_ttl=30)
def hard_limited(self: LockedTask, key: str) -> None:
    body(key, 10, self.request.id)


@app.task(bind=True, base=LockedTask, lock_ttl=30)
def long_running(self: LockedTask, key: str, seconds: float = 10) -> dict[str, Any]:
    return body(key, seconds, self.request.id)


@app.task(base=LockedTask)
def takes_anything(value: Any) -> None:
    return None


class CallsRunItself(LockedTask):
    """Overrides ``__call__`` without calling ``super().__call__``."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(*args, **kwargs)


class CallsSuper(LockedTask):
    """Overrides ``__call__``, calls ``super().__call__``, then says if the lock is still held."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        in_body = super().__call__(*args, **kwargs)
        return [in_body, self.request.lock is not None and self.request.lock.held]


@app.task(bind=True, base=CallsRunItself)
def own_call(self: LockedTask, key: str) -> bool:
    return self.request.lock is not None and self.request.lock.held


@app.task(bind=True, base=CallsSuper)
def own_call_super(self: LockedTask, key: str) -> bool:
    return self.request.lock is not None and self.request.lock.held


class CountsRequestPushes(LockedTask):
    """Counts ``Task.push_request``: Celery's ``Task.__call__`` pushes a copy of the request,
    the tracer does not (it pushes on the stack directly)."""

    pushes = 0

    def push_request(self, *args: Any, **kwargs: Any) -> None:
        CountsRequestPushes.pushes += 1
        super().push_request(*args, **kwargs)


@app.task(bind=True, base=CountsRequestPushes)
def counts_pushes(self: LockedTask, key: str) -> bool:
    return self.request.lock is not None and self.request.lock.held


class EarlyAnswer:
    """A cache (or dry-run) base placed before ``LockedTask``: its ``__call__`` answers
    without calling ``run`` when it can, else calls ``super().__call__``."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("cached"):
            return "from the cache"
        return super().__call__(*args, **kwargs)  # type: ignore[misc]


class Cached(EarlyAnswer, LockedTask):
    pass


@app.task(bind=True, base=Cached, lock_on=("key",))
def answers_early(self: LockedTask, key: str, cached: bool = False) -> dict[str, Any]:
    lock = self.request.lock
    return {"held": lock is not None and lock.held and not lock.reentrant}
