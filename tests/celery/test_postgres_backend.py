"""``singleton_lock_url = "postgresql://..."`` in the Celery layer: it selects the PostgreSQL
backend, registration refuses what that backend lacks (naming it and the option), and
``celery locks list/show/release/doctor`` read, release and check its locks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
from celery import Celery

from celery_singleton_lock import LockedTask
from celery_singleton_lock.celery.config.backend_support import refuse_unsupported
from celery_singleton_lock.celery.config.lockers import forget_locker, locker_for
from celery_singleton_lock.celery.config.servers import check_url
from celery_singleton_lock.celery.worker.server_probe import probe_postgres
from celery_singleton_lock.engine import POSTGRES, AcquireRequest, Lease, Owner
from celery_singleton_lock.engine import postgres_locker as locker_for_url
from celery_singleton_lock.errors import LockConfigurationError
from tests.celery.test_celery_locks import entry_points_dir  # noqa: F401 - the fixture
from tests.celery.test_cli import _ENTRY_POINTS, run_cli
from tests.postgres_support import postgres_schema

pytest.importorskip("psycopg")


@pytest.fixture(scope="module", autouse=True)
def _celery_finds_locks(entry_points_dir: Path) -> None:  # noqa: F811 - the fixture
    _ENTRY_POINTS[:] = [entry_points_dir]


@pytest.fixture
def url() -> Iterator[str]:
    with postgres_schema() as url:
        yield url


@pytest.fixture
def app(url: str) -> Iterator[Celery]:
    app = Celery("pg-config", set_as_current=False)
    app.conf.update(
        broker_url="amqp://guest:guest@127.0.0.1:5672//",
        singleton_lock_url=url,
        singleton_lock_prefix="pgt",
    )
    yield app
    forget_locker(app)


def test_a_postgresql_url_selects_the_postgres_backend(app: Celery) -> None:
    locker = locker_for(app)
    assert locker.capabilities is POSTGRES
    assert locker.queue is not None and locker.markers is not None


@pytest.mark.parametrize("policy", ["queue", "replace", "restart"])
def test_registration_accepts_the_parking_policies_on_postgres(app: Celery, policy: str) -> None:
    @app.task(base=LockedTask, on_duplicate=policy, shared=False)
    def parked(x: int) -> None: ...

    assert parked.lock_options.on_duplicate == policy


@pytest.mark.parametrize(
    ("option", "value"), [("lock_limit", 2), ("lock_rate", "2/m"), ("lock_cooldown", 5)]
)
def test_registration_refuses_a_queue_behind_slots_a_rate_or_a_cooldown_on_postgres(
    app: Celery, option: str, value: Any
) -> None:
    with pytest.raises(LockConfigurationError) as refused:

        @app.task(base=LockedTask, on_duplicate="queue", shared=False, **{option: value})
        def limited(x: int) -> None: ...

        _ = limited.lock_options
    message = refused.value.message
    assert f"on_duplicate='queue' with {option}=" in message and "PostgreSQL" in message


def test_registration_accepts_fencing_on_postgres(app: Celery) -> None:
    @app.task(base=LockedTask, lock_fencing=True, shared=False)
    def fenced(x: int) -> None: ...

    assert fenced.lock_options.fencing is True


def held(app: Celery, name: str, owner: Owner) -> Lease:
    lease = locker_for(app).acquire(AcquireRequest(name, 60, owner, renew=False))
    assert isinstance(lease, Lease)
    return lease


def test_locks_list_shows_a_lock_held_in_postgres(app: Celery, url: str) -> None:
    held(app, "report:1", Owner(task_id="t-1", host="w@h", pid=4242))
    result = run_cli("--url", url, "--prefix", "pgt", "list", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [(row["key"], row["task_id"]) for row in rows] == [("pgt:{report:1}", "t-1")]


def test_locks_show_names_the_holder(app: Celery, url: str) -> None:
    held(app, "report:2", Owner(task_id="t-2", host="w@h", pid=4242))
    result = run_cli("--url", url, "--prefix", "pgt", "show", "report:2")
    assert result.returncode == 0, result.stderr
    assert "t-2" in result.stdout


def test_locks_release_force_frees_the_lock(app: Celery, url: str) -> None:
    held(app, "report:3", Owner(task_id="t-3", host="w@h", pid=4242))
    result = run_cli("--url", url, "--prefix", "pgt", "release", "report:3", "--force")
    assert result.returncode == 0, result.stderr
    assert locker_for(app).inspect.read("report:3") is None


def test_the_start_probe_creates_the_tables_of_a_reachable_database(url: str) -> None:
    assert probe_postgres(url, "pgt") is None
    locker = locker_for_url(url)
    try:
        assert locker.inspect.fence("any") == 0  # the sequence exists
    finally:
        locker.close()


def test_the_start_probe_says_a_database_out_of_reach_may_heal() -> None:
    found = probe_postgres("postgresql://postgres@127.0.0.1:1/test?connect_timeout=2", "pgt")
    assert found is not None and found.heals and "PostgreSQL" in found.cause


def test_a_postgresql_url_with_a_bad_port_is_refused() -> None:
    with pytest.raises(LockConfigurationError, match="invalid"):
        check_url("postgresql://postgres@127.0.0.1:notaport/test")


def test_the_worker_start_refuses_nothing_a_task_did_not_ask_for() -> None:
    refuse_unsupported("t", {"lock_fencing": True}, POSTGRES)  # lock_limit not asked: 1


def test_the_worker_start_refuses_an_option_asked_that_postgres_lacks() -> None:
    with pytest.raises(
        LockConfigurationError, match="lock_min_replicas=1 is not supported on PostgreSQL"
    ):
        refuse_unsupported("t", {"lock_min_replicas": 1}, POSTGRES)


def test_the_tasks_of_a_lock_group_share_one_lock_and_its_slots_on_postgres(
    app: Celery,
) -> None:
    @app.task(base=LockedTask, lock_group="api", lock_on=["tenant"], lock_limit=2, shared=False)
    def charge(tenant: str, amount: int) -> None: ...

    @app.task(base=LockedTask, lock_group="api", lock_on=["tenant"], lock_limit=2, shared=False)
    def refund(tenant: str, order: int) -> None: ...

    name = charge.lock_options.keyer.name(("t1", 5), {})
    assert refund.lock_options.keyer.name(("t1", 9), {}) == name
    locker = locker_for(app)
    taken = [
        locker.acquire(AcquireRequest(name, 60, Owner(task_id=t), renew=False, limit=2))
        for t in ("charge", "refund", "third")
    ]
    assert [outcome.state for outcome in taken] == ["acquired", "acquired", "held"]


@pytest.mark.parametrize(
    "options",
    [
        {"lock_limit": 3},
        {"lock_limit": lambda x: x},
        {"lock_rate": "2/m"},
        {"lock_cooldown": 5},
        {"dedupe_on_enqueue": True},
        {"dedupe_on_enqueue": "until_started"},
    ],
)
def test_registration_accepts_admission_on_postgres(app: Celery, options: dict[str, Any]) -> None:
    @app.task(base=LockedTask, shared=False, **options)
    def admitted(x: int) -> None: ...

    assert admitted.lock_options is not None


def test_registration_still_refuses_min_replicas_naming_postgres(app: Celery) -> None:
    with pytest.raises(LockConfigurationError, match=r"lock_min_replicas.*PostgreSQL"):

        @app.task(base=LockedTask, lock_min_replicas=1, shared=False)
        def replicated(x: int) -> None: ...

        _ = replicated.lock_options


#: the live cap's key of task proj.export under the prefix pgt (engine.cap_key)
CAP = "pgt:cap:proj.export"


def test_locks_limit_sets_a_live_cap_the_slots_then_keep_to(app: Celery, url: str) -> None:
    result = run_cli("--url", url, "--prefix", "pgt", "limit", "proj.export", "1")
    assert result.returncode == 0, result.stderr
    assert "live cap of proj.export: 1" in result.stdout
    locker = locker_for(app)
    taken = [
        locker.acquire(
            AcquireRequest(
                "proj.export:ab", 60, Owner(task_id=t), renew=False, limit=3, cap_key=CAP
            )
        )
        for t in ("first", "second")
    ]
    assert [outcome.state for outcome in taken] == ["acquired", "held"]
    shown = run_cli("--url", url, "--prefix", "pgt", "show", "proj.export:ab")
    assert "live cap: 1 slot(s) taken at most" in shown.stdout


def test_locks_limit_reset_removes_a_postgres_live_cap(app: Celery, url: str) -> None:
    run_cli("--url", url, "--prefix", "pgt", "limit", "proj.export", "2")
    reset = run_cli("--url", url, "--prefix", "pgt", "limit", "proj.export", "--reset")
    assert "live cap of proj.export: none" in reset.stdout
    assert locker_for(app).live_rules.read("proj.export").cap is None


def test_locks_pause_on_postgres_is_refused_naming_the_backend(url: str) -> None:
    result = run_cli("--url", url, "--prefix", "pgt", "pause", "proj.export")
    assert result.returncode != 0
    assert "PostgreSQL row leases keeps live caps (celery locks limit) but no pause" in (
        result.stderr
    )


def test_locks_resume_on_postgres_is_refused_naming_the_backend(url: str) -> None:
    result = run_cli("--url", url, "--prefix", "pgt", "resume", "proj.export")
    assert result.returncode != 0
    assert "PostgreSQL row leases keeps live caps (celery locks limit) but no pause" in (
        result.stderr
    )


def test_pause_for_in_a_body_on_postgres_is_refused_naming_the_task_and_the_backend(
    app: Celery,
) -> None:
    @app.task(base=LockedTask, bind=True, shared=False)
    def pausing(self: Any, x: int) -> str:
        try:
            self.request.lock.pause_for(5)
        except LockConfigurationError as exc:
            return exc.message
        return "paused"

    said = pausing.apply(args=(1,)).get()
    assert said.startswith(f"task {pausing.name}: pause_for needs one Redis server")
    assert "on PostgreSQL row leases, which keeps no pause" in said


def test_locks_list_names_a_postgres_live_cap(url: str) -> None:
    run_cli("--url", url, "--prefix", "pgt", "limit", "proj.export", "2")
    listed = run_cli("--url", url, "--prefix", "pgt", "list")
    assert "proj.export: live cap 2 (celery locks limit)" in listed.stdout


def test_locks_doctor_checks_a_postgres_lock_server(app: Celery, url: str) -> None:
    held(app, "report:4", Owner(task_id="t-4", host="w@h", pid=4242))
    result = run_cli("--url", url, "--prefix", "pgt", "doctor", "--json")
    assert result.returncode == 0, result.stderr
    findings = json.loads(result.stdout)
    assert any(f["check"] == "server" and "PostgreSQL" in f["message"] for f in findings)
    assert all(f["severity"] == "info" for f in findings), findings


def test_locks_list_of_a_schema_no_worker_used_yet_reads_no_locks(url: str) -> None:
    result = run_cli("--url", url, "--prefix", "pgt", "list", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_the_lock_console_lists_a_lock_held_in_postgres(app: Celery) -> None:
    import http.client
    import threading

    from celery_singleton_lock.celery.cli.console import make_console
    from celery_singleton_lock.celery.observe.serving import quiet_server

    held(app, "report:5", Owner(task_id="t-5", host="w@h", pid=4242))
    console = make_console(app, ping_timeout=1.0)
    server = quiet_server("127.0.0.1", 0, console)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=20)
        connection.request("GET", "/locks.json", headers={"Host": "127.0.0.1"})
        listed = json.loads(connection.getresponse().read())
        connection.close()
    finally:
        server.shutdown()
        server.server_close()
        console.close()
    assert [(lock["key"], lock["task_id"]) for lock in listed["locks"]] == [
        ("pgt:{report:5}", "t-5")
    ]


def test_the_parked_gauge_of_a_postgres_app_counts_its_parked_rows(app: Celery) -> None:
    from celery_singleton_lock.celery.observe.metrics import parked_by_task

    locker = locker_for(app)
    for task_id in ("t-6", "t-7", "t-8"):
        request = AcquireRequest("report:6", 60, Owner(task_id=task_id), renew=False)
        locker.acquire(request._replace(park=f"{task_id}\n{{}}".encode()))
    assert parked_by_task(locker) == {"report": 2}


def test_the_worker_start_refuses_a_queue_with_a_rate_on_postgres() -> None:
    asked = {"on_duplicate": "queue", "lock_rate": (2, 60.0)}
    with pytest.raises(LockConfigurationError, match=r"lock_rate=\(2, 60.0\) is not supported"):
        refuse_unsupported("t", asked, POSTGRES)


def test_locks_show_lists_the_calls_parked_behind_a_lock(app: Celery, url: str) -> None:
    locker = locker_for(app)
    for task_id in ("t-holder", "t-first", "t-second"):
        request = AcquireRequest("report:4", 60, Owner(task_id=task_id), renew=False)
        locker.acquire(request._replace(park=f"{task_id}\n{{}}".encode()))
    result = run_cli("--url", url, "--prefix", "pgt", "show", "report:4")
    assert result.returncode == 0, result.stderr
    assert "t-holder" in result.stdout
    assert "parked: 2 call(s), oldest first: t-first t-second" in result.stdout
