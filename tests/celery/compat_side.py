"""What the side-by-side modules share (test_compat_side_by_side.py, test_compat_canvas.py,
test_compat_settings.py): the original packages beside ours, fixtures, and reading how long a
queued call blocks on each. The fixtures are imported by name into those modules."""

from __future__ import annotations

from typing import Any, Iterator

import celery_singleton
import celery_singleton.backends
import pytest

from celery_singleton_lock import compat
from celery_singleton_lock.celery.config.lockers import forget_locker, locker_for
from tests.celery import compatapp
from tests.celery.workers import Servers, unique, worker_group
from tests.support import wait_until

try:
    import celery_once
except ImportError:  # not installed, or six missing
    celery_once = None

#: the celery-once half of a module
needs_celery_once = pytest.mark.skipif(
    celery_once is None, reason="celery-once cannot be imported (pip install celery-once six)"
)

IMPLS = ["original", "ours"]
ALREADY_QUEUED = {
    "original": getattr(celery_once, "AlreadyQueued", None),
    "ours": compat.AlreadyQueued,
}
DUPLICATE_TASK_ERROR = {
    "original": celery_singleton.DuplicateTaskError,
    "ours": compat.DuplicateTaskError,
}
CLEAR_LOCKS = {"original": celery_singleton.clear_locks, "ours": compat.clear_locks}
APP = "tests.celery.compatapp"


@pytest.fixture(scope="module")
def queue(servers: Servers) -> Iterator[str]:
    """The test process sends through compatapp, to a queue of this module's own."""
    name = unique("compat")
    # celery-singleton keeps the first backend it made for the whole process: one made for
    # another module's app (test_plain_app.py's, on a server since stopped) would serve the
    # original's calls here, and this module's would outlive it
    celery_singleton.backends._backend = None
    compatapp.configure(
        broker_url=servers.broker_url,
        lock_url=servers.lock.url,
        queue=name,
        backend_url=servers.backend_url,
    )
    yield name
    forget_locker(compatapp.app)
    celery_singleton.backends._backend = None


def start_worker(
    servers: Servers, queue: str, app: str = APP, pool: str = "threads"
) -> Iterator[Any]:
    """One real ``celery worker`` (4 slots) of ``app`` on ``queue``, for a module."""
    with worker_group(servers) as group:
        (started,) = group.start(1, queue=queue, pool=pool, concurrency=4, app=app)
        yield started


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def key() -> Iterator[str]:
    """A fresh lock key; its gate is opened at the end, so that a failed test leaves no body
    holding a worker slot until its gate timeout."""
    fresh = unique("k")
    yield fresh
    compatapp.open_gate(fresh, 2)


def running(key: str, count: int = 1) -> list[str]:
    return wait_until(lambda: len(compatapp.runs(key)) >= count and compatapp.runs(key))


def seconds_a_queued_call_blocks(task: Any, impl: str, args: tuple[Any, ...]) -> float:
    """How long the queued call of ``task`` blocks duplicates if it never runs, read on the
    lock server: the original's lock key's PTTL, our queued marker's."""
    if impl == "ours":
        name = task.lock_options.keyer.name(args, {})
        return float(locker_for(task.app).markers.queued_for(name) or 0.0)
    if not isinstance(task, celery_singleton.Singleton):  # celery-once's
        lock = task.get_key(args, {})
    else:
        lock = task.generate_lock(task.name, args, {})
    return float(compatapp.store().pttl(lock)) / 1000


def assert_a_queued_call_blocks_for(task: Any, impl: str, key: str, seconds: float) -> None:
    """A call of ``task`` that is never consumed returns its own id to a duplicate, and
    blocks duplicates for (about) ``seconds``."""
    first = task.apply_async((key,), queue=unique("nobody"))
    assert task.delay(key).id == first.id
    assert seconds - 10 < seconds_a_queued_call_blocks(task, impl, (key,)) <= seconds
