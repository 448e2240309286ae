"""An argument the lock key cannot encode (a set, an object) sent with the pickle serializer:
refused at ``apply_async`` where the caller names the lock (``dedupe_on_enqueue``), else failed
on the worker; both errors name the task, the argument and what to do instead.

Why not refuse it at every ``apply_async``: naming the lock there would cost every producer a
hash per send and run ``lock_key`` callables in producers, where a callable may not work; under
JSON (the default) such a value already fails at the send, kombu cannot encode it.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_singleton_lock import UnsupportedArgumentError
from tests.celery.tasks import dedupe, runtime
from tests.celery.test_enqueue_dedupe import published


def assert_names_task_argument_and_fix(error: BaseException, task: Any) -> None:
    message = str(error)
    assert task.name in message
    assert "argument key has type builtins.set" in message
    assert "send sorted(...) (a list) instead" in message


def test_a_set_is_refused_at_apply_async_when_the_caller_names_the_lock(worker: Any) -> None:
    with published(dedupe.dedupe_gated) as ids, pytest.raises(UnsupportedArgumentError) as info:
        dedupe.dedupe_gated.apply_async(({"a", "b"},), serializer="pickle")
    assert ids == []
    assert_names_task_argument_and_fix(info.value, dedupe.dedupe_gated)


def test_a_pickled_set_fails_on_the_worker_naming_task_argument_and_fix(worker: Any) -> None:
    result = runtime.gated.apply_async(({"a", "b"},), serializer="pickle")
    with pytest.raises(UnsupportedArgumentError) as info:
        result.get(timeout=20)
    assert result.state == "FAILURE"
    assert_names_task_argument_and_fix(info.value, runtime.gated)
