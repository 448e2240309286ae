"""What the Celery layer relies on in Celery itself (``celery_api``): each test fails on a
Celery release that changes it."""

from __future__ import annotations

import inspect
import logging
import time
import uuid
from functools import cached_property
from typing import Any

import pytest
from celery import Celery, Task
from celery.app.task import Context
from celery.exceptions import Ignore

from celery_singleton_lock.celery import celery_api
from tests.celery.tasks import adapter, canvas, join


@pytest.fixture
def eager_app() -> Celery:
    return Celery("celery-api", set_as_current=False)


def test_an_undeclared_request_attribute_becomes_a_message_header() -> None:
    # why declare_request_attribute("lock") exists
    assert Context({"id": "t", "csl_undeclared": 1}).headers == {"csl_undeclared": 1}


def test_a_declared_request_attribute_stays_request_state() -> None:
    celery_api.declare_request_attribute("lock")
    assert Context({"id": "t", "lock": object()}).headers is None


def test_a_request_that_never_set_a_declared_attribute_reads_none() -> None:
    celery_api.declare_request_attribute("lock")
    assert Context({"id": "t"}).lock is None


def test_the_tracer_calls_an_overridden_call_instead_of_run(eager_app: Celery) -> None:
    calls: list[str] = []

    class Overrides(Task):  # type: ignore[misc]
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            calls.append("__call__")
            return super().__call__(*args, **kwargs)

    @eager_app.task(base=Overrides, shared=False)
    def body() -> str:
        return "ran"

    assert body.apply().get() == "ran"
    assert calls == ["__call__"]


def test_the_tracer_calls_run_without_task_call_when_no_class_overrides_it(
    eager_app: Celery,
) -> None:
    # why LockedTask releases from a wrapped run, not __call__: Task.__call__ pushes a copy
    # of the request for every task; the tracer pushes its own on the stack directly
    pushes: list[bool] = []

    class CountsPushes(Task):  # type: ignore[misc]
        def push_request(self, *args: Any, **kwargs: Any) -> None:
            pushes.append(True)
            super().push_request(*args, **kwargs)

    @eager_app.task(base=CountsPushes, shared=False)
    def body() -> str:
        return "ran"

    assert body.apply().get() == "ran"
    assert pushes == []


def test_ignore_raised_in_before_start_ends_the_task_ignored_without_its_body(
    eager_app: Celery,
) -> None:
    ran: list[bool] = []

    class Refuses(Task):  # type: ignore[misc]
        def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
            raise Ignore("refused")

    @eager_app.task(base=Refuses, shared=False)
    def body() -> None:
        ran.append(True)

    assert body.apply().state == "IGNORED"
    assert ran == []


def test_a_custom_header_reaches_the_running_request(worker: Any, unique_key: str) -> None:
    result = adapter.reads_its_request.apply_async((unique_key,), headers={"csl_test_header": 7})
    assert result.get(timeout=10)["header"] == 7


def test_the_hard_time_limit_of_the_message_reaches_the_request(
    worker: Any, unique_key: str
) -> None:
    result = adapter.reads_its_request.apply_async((unique_key,), time_limit=42)
    assert result.get(timeout=10)["hard_time_limit"] == 42.0


def test_a_first_delivery_is_not_redelivered(worker: Any, unique_key: str) -> None:
    assert adapter.reads_its_request.delay(unique_key).get(timeout=10)["redelivered"] is False


def test_the_current_request_is_the_top_of_the_request_stack(worker: Any, unique_key: str) -> None:
    assert adapter.reads_its_request.delay(unique_key).get(timeout=10)["is_current"] is True


def test_stored_states_are_read_back_as_outcomes(celery_app: Any) -> None:
    task = adapter.reads_its_request
    request = Context({"id": str(uuid.uuid4()), "task": task.name})
    celery_api.store_started(task, request.id, request, {"pid": 1, "hostname": "h"})
    assert not celery_api.outcome_is_stored(task, request.id)
    celery_api.store_retry(task, request, ValueError("again"))
    assert task.backend.get_task_meta(request.id)["status"] == "RETRY"
    celery_api.store_not_run(task, request, ValueError("skipped"))
    assert celery_api.outcome_is_stored(task, request.id)


def test_a_call_stored_as_not_run_is_revoked_and_get_raises_its_exception(
    celery_app: Any,
) -> None:
    task = adapter.reads_its_request
    request = a_request(task)
    celery_api.store_not_run(task, request, join.AccountMissing("held by the-holder"))
    result = task.AsyncResult(request.id)
    assert (result.state, result.failed()) == ("REVOKED", False)
    with pytest.raises(join.AccountMissing, match="held by the-holder"):
        result.get(timeout=5)


def test_sending_again_keeps_the_task_id_and_adds_the_headers(worker: Any, unique_key: str) -> None:
    task = adapter.reads_its_request
    task_id = str(uuid.uuid4())
    request = Context(
        {
            "id": task_id,
            "task": task.name,
            "args": (unique_key,),
            "kwargs": {},
            "delivery_info": {"routing_key": "celery", "exchange": ""},
            "headers": {},
            "retries": 0,
        }
    )
    celery_api.send_again(task, request, countdown=0, headers={"csl_test_header": "again"})
    assert task.AsyncResult(task_id).get(timeout=10)["header"] == "again"


def test_register_task_names_the_instance_not_its_class(eager_app: Celery) -> None:
    class Unnamed(Task):  # type: ignore[misc]
        def run(self) -> None:
            return None

    registered = eager_app.register_task(Unnamed())
    assert Unnamed.name is None
    assert celery_api.registered_instances(eager_app, Unnamed) == [registered]


def test_the_request_pushed_for_a_body_starts_as_a_copy_of_the_current_one(
    eager_app: Celery,
) -> None:
    # LockedTask.push_request restores this on Celery < 5.5 (celery_api.PUSH_REQUEST_COPIES)
    from celery_singleton_lock import LockedTask

    @eager_app.task(base=LockedTask, bind=True, shared=False)
    def body(self: Any) -> None:
        return None

    body.push_request(id="outer", lock="the lock")
    try:
        body.push_request(args=(), kwargs={})
        assert (body.request.id, body.request.lock) == ("outer", "the lock")
    finally:
        body.pop_request()
        body.pop_request()


def test_the_tracer_logs_an_ignore_as_ignored_with_the_task_id_in_its_context(
    eager_app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    # what celery_api's filter recognises to drop a decision's repeated "ignored" line
    @eager_app.task(bind=True, shared=False)
    def body(self: Any) -> None:
        raise Ignore("decided")

    with caplog.at_level(logging.INFO, logger=celery_api.TRACE_LOGGER):
        result = body.apply()
    (record,) = [r for r in caplog.records if r.name == celery_api.TRACE_LOGGER]
    assert isinstance(record.args, dict)
    assert (record.args["description"], record.args["id"]) == ("ignored", result.id)


def test_a_decision_logged_already_drops_only_its_own_ignored_line(
    eager_app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    @eager_app.task(bind=True, shared=False)
    def announced(self: Any) -> None:
        celery_api.logged_already(self.request.id)
        raise Ignore("decided and logged")

    @eager_app.task(bind=True, shared=False)
    def silent(self: Any) -> None:
        raise Ignore("not logged by us")

    with caplog.at_level(logging.INFO, logger=celery_api.TRACE_LOGGER):
        announced.apply()
        kept = silent.apply()
    ids = [r.args["id"] for r in caplog.records if isinstance(r.args, dict)]
    assert ids == [kept.id]


# -- ending an execution with an outcome it did not compute (on_duplicate="join") ------------


def a_request(task: Any, **fields: Any) -> Context:
    return Context({"id": str(uuid.uuid4()), "task": task.name, "delivery_info": {}, **fields})


def test_a_stored_outcome_is_read_back_with_its_state(celery_app: Any) -> None:
    task = adapter.reads_its_request
    request = a_request(task)
    celery_api.store_started(task, request.id, request, {"pid": 1, "hostname": "h"})
    assert celery_api.stored_outcome(task, request.id) is None
    task.backend.mark_as_done(request.id, {"n": 1}, request=request)
    assert celery_api.stored_outcome(task, request.id) == ("SUCCESS", {"n": 1})


def test_a_stored_failure_is_read_back_as_its_exception(celery_app: Any) -> None:
    task = adapter.reads_its_request
    request = a_request(task)
    task.backend.mark_as_failure(request.id, join.AccountMissing("no account 7"), request=request)
    state, error = celery_api.stored_outcome(task, request.id) or ("", None)
    assert state == "FAILURE"
    assert type(error) is join.AccountMissing and str(error) == "no account 7"


def test_finishing_as_success_stores_the_value_under_the_requests_own_id(celery_app: Any) -> None:
    task = adapter.reads_its_request
    request = a_request(task)
    celery_api.finish_as(task, request, "SUCCESS", [1, "a"])
    assert task.AsyncResult(request.id).get(timeout=5) == [1, "a"]


def test_finishing_as_failure_stores_the_same_exception(celery_app: Any) -> None:
    task = adapter.reads_its_request
    request = a_request(task)
    celery_api.finish_as(task, request, "FAILURE", join.AccountMissing("no account 8"))
    with pytest.raises(join.AccountMissing, match="no account 8"):
        task.AsyncResult(request.id).get(timeout=5)


def test_callbacks_and_the_next_chain_step_are_sent_as_the_tracer_sends_them(
    worker: Any,
) -> None:
    task = adapter.reads_its_request
    linked, nxt, after = (str(uuid.uuid4()) for _ in range(3))
    request = a_request(
        task,
        callbacks=[canvas.tags.s("linked").set(task_id=linked)],
        # the last entry is the next step; the rest travel with it
        chain=[canvas.tags.s("after").set(task_id=after), canvas.tags.s("next").set(task_id=nxt)],
    )
    celery_api.dispatch_callbacks_and_chain(task, request, "value")
    assert canvas.tags.AsyncResult(linked).get(timeout=10) == ["linked", "value"]
    assert canvas.tags.AsyncResult(after).get(timeout=10) == ["after", ["next", "value"]]


def test_a_running_request_is_among_the_workers_running_requests_with_what_renewal_reads(
    worker: Any, unique_key: str
) -> None:
    # what the prefork main process reads to renew its children's locks (worker/child_renewal.py)
    before = time.time()
    seen = adapter.finds_its_worker_request.apply_async((unique_key,), time_limit=42).get(
        timeout=10
    )
    assert seen["found"] and seen["task_is_this"]
    assert seen["child_pid"] == seen["pid"]  # threads pool: the worker itself accepted it
    assert seen["hard_limit"] == 42.0
    assert before - 1 <= seen["accepted_at"] <= time.time()
    assert seen["args"] == [unique_key]
    # the worker node name; a prefork child's task request carries the same one (the main
    # process's renewal by owner depends on it: test_gil_starvation shows it on real workers)
    assert "@" in seen["hostname"]


def test_only_a_prefork_pool_runs_bodies_in_children() -> None:
    from celery.concurrency.prefork import TaskPool
    from celery.concurrency.thread import TaskPool as ThreadPool

    class Consumer:
        def __init__(self, pool: Any) -> None:
            self.pool = pool

    assert celery_api.runs_bodies_in_children(Consumer(TaskPool.__new__(TaskPool)))
    assert not celery_api.runs_bodies_in_children(Consumer(ThreadPool.__new__(ThreadPool)))


def test_terminating_a_request_kills_its_child_and_announces_the_revoke_with_our_reason() -> None:
    """What ``celery_api.terminate`` calls: the pool's ``terminate_job`` and the request's
    ``_announce_revoked`` (as ``Request.terminate`` does, with "terminated")."""
    from celery.worker.request import Request

    calls: list[tuple[Any, ...]] = []

    class Pool:
        def terminate_job(self, pid: int, signum: int) -> None:
            calls.append(("terminate_job", pid, signum))

    request = Request.__new__(Request)
    request.worker_pid = 4321
    request._announce_revoked = lambda *args: calls.append(("announce", *args))  # type: ignore[method-assign]
    celery_api.terminate(request, Pool(), "superseded")
    assert calls == [("terminate_job", 4321, 15), ("announce", "superseded", True, 15, False)]
    announce = Request.__dict__["_announce_revoked"]
    assert list(inspect.signature(announce).parameters) == [
        "self",
        "reason",
        "terminated",
        "signum",
        "expired",
    ]
    assert isinstance(inspect.getattr_static(Request, "_context"), cached_property)


# -- ending an execution quietly (celery_api.quiet_ends) ---------------------------------------


class EndsQuietly(Task):  # type: ignore[misc]
    """Ends in ``before_start`` as a skipped LockedTask does inside a worker's tracer."""

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        assert celery_api.can_end_quietly()
        raise celery_api.EndedQuietly(Ignore("skipped"))


def _quiet_trace(app: Celery, postruns: list[Any]) -> Any:
    from celery.app.trace import build_tracer
    from celery.signals import task_postrun

    def ends_quietly() -> str:
        return "ran"

    task = app.task(name="ends_quietly", base=EndsQuietly, shared=False)(ends_quietly)
    task_postrun.connect(lambda **kw: postruns.append(kw["state"]), sender=task, weak=False)
    tracer = build_tracer(task.name, task, app=app)
    return celery_api.quiet_ends(tracer)(str(uuid.uuid4()), (), {}, {"id": "q"})


def test_the_tracer_lets_a_base_exception_through_and_quiet_ends_makes_it_ignored(
    eager_app: Celery,
) -> None:
    outcome = _quiet_trace(eager_app, [])
    assert (outcome.info.state, type(outcome.retval.exception)) == ("IGNORED", Ignore)


def test_a_quiet_end_runs_the_tracers_postrun(eager_app: Celery) -> None:
    postruns: list[Any] = []
    _quiet_trace(eager_app, postruns)
    assert postruns == [None]


def test_the_worker_builds_a_locked_tasks_tracer_and_it_ends_quietly(worker: Any) -> None:
    # the in-process worker's consumer assigned __trace__ (update_strategies)
    assert getattr(adapter.reads_its_request.__trace__, "quiet_ends", False)


def test_outside_a_wrapped_tracer_nothing_ends_quietly() -> None:
    assert not celery_api.can_end_quietly()
