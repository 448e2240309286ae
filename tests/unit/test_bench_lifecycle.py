"""``python -m bench lifecycle`` traces a call of each shape on a real Redis."""

from __future__ import annotations

from bench import lifecycle
from celery_singleton_lock.testing import RedisServer


def test_a_traced_call_passes_through_the_engine_and_the_celery_layer() -> None:
    with RedisServer.running() as server:
        seen = lifecycle.life("skip", server.url)
    modules = {module for module, _ in seen}
    assert "celery_singleton_lock.celery.task.locked_task" in modules
    assert "celery_singleton_lock.engine.releases" in modules
    assert ("celery_singleton_lock.celery.task.locked_task", "before_start") in seen
