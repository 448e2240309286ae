"""``celery -A tests.celery.lockapp locks ...``: the lock commands as a Celery sub-command, run as
real ``celery`` subprocesses against real Redis servers, with real locks held (by the engine,
or by a task running on a real ``celery worker``).

Celery finds the sub-command through the ``celery.commands`` entry points of the installed
distributions. The tests do not reinstall this checkout: they put a distribution declaring
exactly the entry points of pyproject.toml's ``celery.commands`` table on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest
import redis

from celery_singleton_lock.celery.cli.app_target import open_target
from celery_singleton_lock.celery.cli.lock_release import release_lock
from celery_singleton_lock.engine import Lease, LockKeys, Owner, RedisLocker, Renewer
from tests.celery.tasks import exits, groups, runtime
from tests.celery.workers import Servers, client_app, close_client, lock_key, unique, worker_group
from tests.support import Call, SideBySide, wait_until

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = pytest.importorskip("tomli")

from celery_singleton_lock.testing import RedisServer

REPO = Path(__file__).resolve().parents[2]
APP = "tests.celery.lockapp"

CeleryRun = subprocess.CompletedProcess[str]


# -- running `celery ... locks` -----------------------------------------------------------------


def declared_celery_commands() -> dict[str, str]:
    """pyproject.toml's ``[project.entry-points."celery.commands"]`` table."""
    with open(REPO / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    return dict(project["entry-points"]["celery.commands"])


@pytest.fixture(scope="module")
def entry_points_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding a distribution whose only content is those entry points."""
    root = tmp_path_factory.mktemp("entry-points")
    info = root / "csl_celery_commands-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: csl-celery-commands\nVersion: 0\n")
    lines = [f"{name} = {target}" for name, target in declared_celery_commands().items()]
    (info / "entry_points.txt").write_text("[celery.commands]\n" + "\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    """Broker and lock servers of this module only (results: broker db 1)."""
    with RedisServer.running() as broker, RedisServer.running() as lock:
        yield Servers(broker_url=broker.url, lock=lock)


Celery = Callable[..., CeleryRun]

#: A server that never answers (nothing listens on port 1): the lock server or the broker.
DEAD_URL = "redis://127.0.0.1:1/0"
SHOW_NAMES_NO_TASK_TAKES = ["not-a-lock-name", "tests.celery.tasks.runtime.fenced:42"]
NAMES_NO_TASK_TAKES = ["not-a-lock-name", "tests.celery.runtime.fenced:42"]
BAD_LOCK_URLS = {
    "http-scheme": ("http://x", "not a Redis URL"),
    "db-not-a-number": ("redis://127.0.0.1/abc", "database 'abc' is not a number"),
}
COMMANDS = [["list"], ["show", "a:b"], ["release", "--force", "a:b"]]
APPS_CELERY_CANNOT_LOAD = {"module": "no_such_module_xyz", "attribute": f"{APP}:no_such_app"}
#: The lock the dead-broker release is asked to release (held on a lock server of its own)
DEAD_BROKER_LOCK = f"app.job:{unique('dead-broker')}"


def a_run(*args: str, app: Optional[str] = APP, **settings: str) -> Call:
    """The arguments of one ``celery(...)`` call, in the form the fixture's batch keeps."""
    return args, {"app": app, "cwd": REPO, **settings}


def independent_runs() -> list[Call]:
    """The runs that depend on nothing a test does first: they do not write to this module's
    lock server, and their answers do not depend on what it holds."""
    runs = [
        a_run("--help", app=None),
        a_run("locks", "list"),
        a_run("locks", "--prefix", "bad prefix{", "list"),
        a_run("locks", "show", "--task", "no.such.task"),
        a_run("locks", "list", "--no-such-option"),
    ]
    runs += [a_run("locks", "show", given) for given in SHOW_NAMES_NO_TASK_TAKES]
    for given in NAMES_NO_TASK_TAKES:
        runs.append(a_run("locks", "release", "--force", given))
        runs.append(a_run("locks", "clear-queued", given))
    for command in COMMANDS:
        runs += [a_run("locks", *command, CSL_LOCK_URL=url) for url, _ in BAD_LOCK_URLS.values()]
        runs.append(a_run("locks", *command, CSL_LOCK_URL=DEAD_URL))
    runs += [a_run("locks", "list", app=app) for app in APPS_CELERY_CANNOT_LOAD.values()]
    return runs


#: ``celery`` processes run at once: each is mostly one core's import time, and the slow one
#: (a dead broker's connection retries, about 7 s) waits on the network.
SIDE_BY_SIDE = 3


@pytest.fixture(scope="module")
def dead_broker_lock_server() -> Iterator[RedisServer]:
    """The lock server of the dead-broker release: its own, so that the orphaned lock it holds
    is seen by no other command of this module (``doctor`` would report it)."""
    with RedisServer.running() as server:
        held_by(
            RedisLocker(server.client(), renewer=Renewer(autostart=False)),
            DEAD_BROKER_LOCK,
            task_id="t-b",
            host="w@box",
            pid=3,
        )
        yield server


@pytest.fixture(scope="module")
def celery_process(entry_points_dir: Path, servers: Servers) -> Celery:
    """``celery_process(*args, app=APP, cwd=REPO, **CSL_settings)``: run ``celery -A app
    *args`` with lockapp configured for this module's servers, or the ``CSL_*`` variables
    given."""

    def run(*args: str, app: Optional[str] = APP, cwd: Path = REPO, **settings: str) -> CeleryRun:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("CSL_", "CELERY_")) and k != "SINGLETON_LOCK_URL"
        }
        env.update(
            PYTHONPATH=os.pathsep.join(
                filter(None, [str(entry_points_dir), str(REPO), env.get("PYTHONPATH")])
            ),
            CSL_BROKER_URL=servers.broker_url,
            CSL_BACKEND_URL=servers.backend_url,
            CSL_LOCK_URL=servers.lock.url,
        )
        env.update(settings)
        command = [sys.executable, "-m", "celery", *(["-A", app] if app else []), *args]
        return subprocess.run(
            command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120
        )

    return run


@pytest.fixture(scope="module")
def celery(celery_process: Celery, dead_broker_lock_server: RedisServer) -> Iterator[Celery]:
    """:func:`celery_process`, with the runs of :func:`independent_runs` (and the dead-broker
    release) started together at the first ask, a few at a time; each is still a ``celery``
    process of its own, and the test that asks for one gets that run's result."""
    dead_broker = {"CSL_BROKER_URL": DEAD_URL, "CSL_LOCK_URL": dead_broker_lock_server.url}
    batch = [a_run("locks", "release", DEAD_BROKER_LOCK, **dead_broker), *independent_runs()]
    with SideBySide(celery_process, batch, at_once=SIDE_BY_SIDE) as runs:

        def celery(
            *args: str, app: Optional[str] = APP, cwd: Path = REPO, **settings: str
        ) -> CeleryRun:
            return runs(*args, app=app, cwd=cwd, **settings)

        yield celery


def no_traceback(result: CeleryRun) -> CeleryRun:
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    return result


def the_error(result: CeleryRun) -> str:
    """The one ``Error:`` line of a failed run (asserting there is nothing else on stderr)."""
    no_traceback(result)
    assert result.returncode == 2, result
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error: ")]
    assert len(errors) == 1, result.stderr
    # the line naming the server may come first (release, show): nothing else
    assert all(line in errors or line.startswith("lock ") for line in lines), result.stderr
    return errors[0]


@pytest.fixture(scope="module")
def lock_store(servers: Servers) -> Iterator[redis.Redis]:
    client = servers.lock.client(socket_timeout=5)
    yield client
    client.close()


@pytest.fixture
def locker(lock_store: redis.Redis) -> RedisLocker:
    return RedisLocker(lock_store, renewer=Renewer(autostart=False))


@pytest.fixture
def name() -> str:
    return f"app.job:{unique('n')}"


def held_by(locker: RedisLocker, name: str, **owner: Any) -> str:
    """Take lock ``name`` for ``owner`` (not renewed: nothing in this process must touch it)."""
    locker.try_acquire(name, 60, owner=Owner(**owner), renew=False)
    return locker.keys(name).lock


# -- the sub-command is Celery's ------------------------------------------------------------


def test_celery_lists_locks_among_its_commands(celery: Celery) -> None:
    result = no_traceback(celery("--help", app=None))
    assert result.returncode == 0, result.stderr
    assert "locks" in result.stdout


def test_doctor_warns_that_the_apps_fenced_tasks_run_on_a_server_without_aof(
    celery: Celery,
) -> None:
    result = no_traceback(celery("locks", "doctor"))
    warnings = [line for line in result.stdout.splitlines() if line.startswith("WARNING")]
    assert (result.returncode, [w.startswith("WARNING persistence") for w in warnings]) == (
        1,
        [True],
    )


def test_the_lock_server_is_the_one_the_app_loaded_by_celery_uses(
    celery: Celery, servers: Servers
) -> None:
    result = no_traceback(celery("locks", "list"))
    assert result.returncode == 0, result.stderr
    assert f"on {servers.lock.url} (from app 'lockapp', its singleton_lock_url)" in result.stderr


# -- list and show ----------------------------------------------------------------------------


def test_list_json_is_one_document_of_holders(
    celery: Celery, locker: RedisLocker, name: str
) -> None:
    key = held_by(locker, name, task_id="t-json", host="w1@box", pid=42)
    result = no_traceback(celery("locks", "list", "--json"))
    assert result.returncode == 0, result.stderr
    holders = {holder["key"]: holder for holder in json.loads(result.stdout)}
    holder = holders[key]
    assert list(holder) == [
        "key",
        "name",
        "task_id",
        "host",
        "pid",
        "acquired_at",
        "ttl",
        "fence",
        "slot",
        "cooldown",
        "cooldown_left",
        "parked",
        "rate_starts",
        "live_cap",
        "paused",
        "paused_until",
    ]
    assert (holder["name"], holder["task_id"], holder["host"], holder["pid"]) == (
        name,
        "t-json",
        "w1@box",
        42,
    )


def test_list_json_names_the_lock_and_the_slot_of_each_holder_of_a_limited_lock(
    celery: Celery, locker: RedisLocker, name: str
) -> None:
    for task_id in ("s1", "s2"):
        locker.try_acquire(name, 60, owner=Owner(task_id=task_id), limit=3, renew=False)
    result = no_traceback(celery("locks", "list", "--json"))
    listed = [h for h in json.loads(result.stdout) if h["name"] == name]
    assert sorted((h["task_id"], h["slot"]) for h in listed) == [("s1", 1), ("s2", 2)]


def test_show_names_each_slots_holder_the_cooldown_left_and_the_rate_windows_use(
    celery: Celery, locker: RedisLocker, name: str
) -> None:
    rate = (5, 60.0)
    first = locker.try_acquire(name, 60, owner=Owner(task_id="s1"), limit=3, rate=rate)
    locker.try_acquire(name, 60, owner=Owner(task_id="s2"), limit=3, rate=rate, renew=False)
    assert isinstance(first, Lease)
    locker.cooldown.release_cooling(first, 30)
    lines = no_traceback(celery("locks", "show", name)).stdout.splitlines()
    assert "cooldown=" in lines[0] and " left" in lines[0]
    assert lines[1].startswith(f"{locker.keys(name).lock}:slot:2  task=s2  ")
    assert lines[2].startswith("rate: 2 start(s) in the window, empty in ")


def test_show_names_the_holder(celery: Celery, locker: RedisLocker, name: str) -> None:
    key = held_by(locker, name, task_id="t-show", host="w1@box", pid=7)
    result = no_traceback(celery("locks", "show", name))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{key}  task=t-show  host=w1@box  pid=7  ")


def test_show_task_computes_the_name_with_the_app_celery_loaded(
    celery: Celery, locker: RedisLocker
) -> None:
    account = unique("acct")
    lock_name = runtime.fenced.lock_options.keyer.name([account], {})
    key = held_by(locker, lock_name, task_id="t-task", host="w1@box", pid=8)
    result = no_traceback(
        celery("locks", "show", "--task", runtime.fenced.name, "--args", json.dumps([account]))
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{key}  task=t-task  ")


@pytest.fixture
def charged(locker: RedisLocker) -> Iterator[tuple[str, str]]:
    """(tenant, lock name) of a call of ``groups.charge`` (lock_group ``api``, lock_limit 2)
    holding slot 1 of its group's lock, as a worker would."""
    tenant = unique("tenant")
    name = groups.charge.lock_options.keyer.name((tenant, 5, "run"), {})
    owner = Owner(task_id="t-charge", host="w1@box", pid=9)
    lease = locker.try_acquire(name, 60, owner=owner, limit=2, renew=False)
    assert isinstance(lease, Lease)
    yield tenant, name
    locker.release(lease)


def test_list_names_a_group_lock_after_the_group(celery: Celery, charged: tuple[str, str]) -> None:
    _, name = charged
    rows = json.loads(no_traceback(celery("locks", "list", "--json")).stdout)
    (row,) = [row for row in rows if row["name"] == name]
    assert row["name"].startswith("api:") and row["task_id"] == "t-charge"


def test_show_task_of_another_task_of_the_group_finds_the_shared_lock(
    celery: Celery, charged: tuple[str, str]
) -> None:
    tenant, name = charged
    args = json.dumps([tenant, "o1", "run"])
    result = no_traceback(celery("locks", "show", "--task", groups.refund.name, "--args", args))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"singleton-lock:{{{name}}}  task=t-charge  ")


@pytest.mark.parametrize("given", SHOW_NAMES_NO_TASK_TAKES)
def test_show_of_a_name_no_task_takes_is_one_error_line(celery: Celery, given: str) -> None:
    line = the_error(celery("locks", "show", given))
    assert f"{given!r} is not a lock name" in line and "--task" in line


@pytest.mark.parametrize("given", NAMES_NO_TASK_TAKES)
def test_release_of_a_name_no_task_takes_is_one_error_line(celery: Celery, given: str) -> None:
    line = the_error(celery("locks", "release", "--force", given))
    assert f"{given!r} is not a lock name" in line


@pytest.mark.parametrize("given", NAMES_NO_TASK_TAKES)
def test_clear_queued_of_a_name_no_task_takes_is_one_error_line(celery: Celery, given: str) -> None:
    line = the_error(celery("locks", "clear-queued", given))
    assert f"{given!r} is not a lock name" in line


def test_show_of_a_free_lock_of_a_task_exits_1_saying_free(celery: Celery) -> None:
    lock_name = runtime.fenced.lock_options.keyer.name([unique("acct")], {})
    result = no_traceback(celery("locks", "show", lock_name))
    assert result.returncode == 1, result.stderr
    assert result.stdout.strip() == f"singleton-lock:{{{lock_name}}}: free"


def test_list_under_the_wrong_prefix_names_the_prefixes_holding_locks(
    celery: Celery, locker: RedisLocker, name: str
) -> None:
    held_by(locker, name, task_id="t-p")
    result = no_traceback(celery("locks", "--prefix", "mine", "list"))
    assert result.returncode == 0, result.stderr
    assert "0 lock(s) held under prefix 'mine'" in result.stderr
    assert "'singleton-lock'" in result.stderr and "(use --prefix)" in result.stderr


# -- release: the holder is gone, or not --------------------------------------------------------


def test_release_of_a_free_lock_exits_1_saying_so(celery: Celery) -> None:
    name = runtime.fenced.lock_options.keyer.name([unique("acct")], {})
    result = no_traceback(celery("locks", "release", name))
    assert result.returncode == 1
    assert result.stdout.strip() == f"singleton-lock:{{{name}}}: free, nothing to release"


def test_release_frees_a_lock_whose_node_does_not_answer(
    celery: Celery, locker: RedisLocker, lock_store: redis.Redis, name: str
) -> None:
    key = held_by(locker, name, task_id="t-gone", host="gone@nowhere", pid=9)
    result = no_traceback(celery("locks", "release", name, "--ping-timeout", "0.5"))
    assert result.returncode == 0, result.stderr
    assert "released (held by task t-gone on node gone@nowhere, pid 9" in result.stdout
    assert lock_store.exists(key) == 0


def test_release_refuses_a_lock_taken_outside_a_worker(
    celery: Celery, locker: RedisLocker, lock_store: redis.Redis, name: str
) -> None:
    key = held_by(locker, name, task_id="t-plain", host="plainhost", pid=10)
    line = the_error(celery("locks", "release", name))
    assert "not a Celery worker node" in line and "--force" in line
    assert lock_store.exists(key) == 1


def test_forced_release_frees_a_lock_taken_outside_a_worker(
    celery: Celery, locker: RedisLocker, lock_store: redis.Redis, name: str
) -> None:
    key = held_by(locker, name, task_id="t-plain", host="plainhost", pid=10)
    result = no_traceback(celery("locks", "release", "--force", name))
    assert result.returncode == 0, result.stderr
    assert lock_store.exists(key) == 0


@dataclass
class HeldByAWorker:
    """What ``release`` did to locks held by tasks running on a real worker node: one while
    the node answers pings (without, then with ``--force``), one after the node was killed."""

    node: str
    task_id: str
    key: str
    refused: CeleryRun
    held_after_refusal: int
    forced: CeleryRun
    held_after_force: int
    published: list[str]
    #: the second lock, released without --force once its node was killed
    orphan_key: str
    orphaned: CeleryRun
    orphan_held_after: int


def published_on(pubsub: Any, count: int = 20) -> list[str]:
    """The first message published on ``pubsub``'s channel, within ``count`` short waits."""
    for _ in range(count):
        message = pubsub.get_message(timeout=0.1)
        if message and message["type"] == "message":
            return [message["data"].decode()]
    return []


@pytest.fixture(scope="module")
def held_by_a_worker(celery: Celery, servers: Servers, lock_store: redis.Redis) -> HeldByAWorker:
    """Two ``long_running`` tasks hold their locks on a real prefork worker; ``release`` runs
    on the first without and with ``--force`` while the worker answers pings, and on the
    second after the worker was killed (SIGKILL: the lock stays until its TTL)."""
    task = exits.long_running
    key, orphan = unique("k"), unique("k")
    lock, orphan_lock = (lock_key(task, k, seconds=60) for k in (key, orphan))
    client = client_app(servers)
    try:
        with worker_group(servers) as workers:
            [worker] = workers.start(1, pool="prefork", concurrency=2)
            sent = [
                client.send_task(task.name, args=(k,), kwargs={"seconds": 60}, queue=worker.queue)
                for k in (key, orphan)
            ]
            wait_until(lambda: lock_store.exists(lock, orphan_lock) == 2, timeout=30)
            refused = celery("locks", "release", lock)
            held_after_refusal = int(lock_store.exists(lock))
            channel = LockKeys.build("singleton-lock", lock[len("singleton-lock:{") : -1]).channel
            pubsub = lock_store.pubsub()
            pubsub.subscribe(channel)
            try:
                wait_until(lambda: pubsub.get_message(timeout=0.1), timeout=5)  # subscribed
                forced = celery("locks", "release", "--force", lock)
                held_after_force = int(lock_store.exists(lock))
                published = published_on(pubsub)
            finally:
                pubsub.close()
            worker.kill_group()
            worker.wait_exit(10)
            orphaned = celery("locks", "release", "--ping-timeout", "1", orphan_lock)
            return HeldByAWorker(
                node=worker.name,
                task_id=sent[0].id,
                key=lock,
                refused=refused,
                held_after_refusal=held_after_refusal,
                forced=forced,
                held_after_force=held_after_force,
                published=published,
                orphan_key=orphan_lock,
                orphaned=orphaned,
                orphan_held_after=int(lock_store.exists(orphan_lock)),
            )
    finally:
        close_client(client)


def test_release_refuses_while_the_holders_node_answers_ping(
    held_by_a_worker: HeldByAWorker,
) -> None:
    line = the_error(held_by_a_worker.refused)
    assert line.startswith(
        f"Error: lock {held_by_a_worker.key} is held by task {held_by_a_worker.task_id} "
        f"on node {held_by_a_worker.node}, pid "
    ), line
    assert line.endswith(" (alive: answered ping); use --force to release anyway"), line


def test_a_refused_release_leaves_the_lock_held(held_by_a_worker: HeldByAWorker) -> None:
    assert held_by_a_worker.held_after_refusal == 1


def test_forced_release_frees_a_lock_whose_node_answers(held_by_a_worker: HeldByAWorker) -> None:
    forced = no_traceback(held_by_a_worker.forced)
    assert forced.returncode == 0, forced.stderr
    assert held_by_a_worker.held_after_force == 0


def test_forced_release_publishes_the_release(held_by_a_worker: HeldByAWorker) -> None:
    assert held_by_a_worker.published == [held_by_a_worker.key]


def test_release_frees_the_lock_of_a_killed_worker_without_force(
    held_by_a_worker: HeldByAWorker,
) -> None:
    orphaned = no_traceback(held_by_a_worker.orphaned)
    assert orphaned.returncode == 0, orphaned.stderr
    assert f"on node {held_by_a_worker.node}" in orphaned.stdout
    assert "did not answer a ping" in orphaned.stdout
    assert held_by_a_worker.orphan_held_after == 0


# -- release: owner-checked -------------------------------------------------------------------


def test_release_leaves_a_lock_that_changed_hands_after_it_was_read(
    locker: RedisLocker, lock_store: redis.Redis, servers: Servers, name: str
) -> None:
    """Between the read and the release, the holder's lock expires and another run takes it:
    the release (the function the commands call, on a real server) must not delete it."""
    held_by(locker, name, task_id="t-old", host="old@box", pid=1)
    taker = RedisLocker(lock_store, renewer=Renewer(autostart=False))

    def changes_hands(node: str) -> bool:
        lock_store.delete(locker.keys(name).lock)  # as its TTL running out would
        taker.try_acquire(name, 60, owner=Owner(task_id="t-new", host="new@box", pid=2))
        return False  # "old@box" did not answer

    target = open_target(url=servers.lock.url)
    try:
        outcome = release_lock(target, name, is_alive=changes_hands)
    finally:
        target.close()
    assert outcome.released is False
    assert outcome.now is not None and outcome.now.task_id == "t-new"
    holder = locker.inspect.read(name)
    assert holder is not None and holder.task_id == "t-new"


# -- bad input: one line, no traceback -------------------------------------------------------


@pytest.mark.parametrize(("url", "says"), BAD_LOCK_URLS.values(), ids=BAD_LOCK_URLS)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_lock_url_is_one_error_line(
    celery: Celery, command: list[str], url: str, says: str
) -> None:
    line = the_error(celery("locks", *command, CSL_LOCK_URL=url))
    assert says in line


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unreachable_lock_server_is_one_error_line(celery: Celery, command: list[str]) -> None:
    line = the_error(celery("locks", *command, CSL_LOCK_URL=DEAD_URL))
    assert "unavailable" in line and DEAD_URL in line


def test_a_bad_prefix_is_one_error_line(celery: Celery) -> None:
    line = the_error(celery("locks", "--prefix", "bad prefix{", "list"))
    assert "prefix 'bad prefix{' is invalid" in line


def test_an_unreachable_broker_is_one_error_line_for_release(
    celery: Celery, dead_broker_lock_server: RedisServer
) -> None:
    # the lock, held by task t-b on node w@box, is dead_broker_lock_server's
    line = the_error(
        celery(
            "locks",
            "release",
            DEAD_BROKER_LOCK,
            CSL_BROKER_URL=DEAD_URL,
            CSL_LOCK_URL=dead_broker_lock_server.url,
        )
    )
    assert "cannot ask worker node 'w@box' whether it is alive" in line and "--force" in line


def test_show_task_of_an_unknown_task_is_one_error_line(celery: Celery) -> None:
    line = the_error(celery("locks", "show", "--task", "no.such.task"))
    assert "no.such.task" in line and "not registered" in line


def test_an_unknown_option_is_one_error_line(celery: Celery) -> None:
    line = the_error(celery("locks", "list", "--no-such-option"))
    assert "--no-such-option" in line


@pytest.mark.parametrize(
    ("app", "says"),
    [
        (APPS_CELERY_CANNOT_LOAD["module"], "no_such_module_xyz"),
        (APPS_CELERY_CANNOT_LOAD["attribute"], "no_such_app"),
    ],
    ids=["module", "attribute"],
)
def test_an_app_celery_cannot_load_is_reported_by_celery_without_a_traceback(
    celery: Celery, app: str, says: str
) -> None:
    result = no_traceback(celery("locks", "list", app=app))
    assert result.returncode != 0
    assert "Unable to load celery application" in result.stderr and says in result.stderr


# -- celery's own options apply ---------------------------------------------------------------


def test_the_broker_given_with_celery_b_is_the_lock_server(
    celery: Celery, servers: Servers, tmp_path: Path
) -> None:
    """``celery -b URL`` reaches the app only through ``$CELERY_BROKER_URL``, which Celery's
    settings read in their ``broker_url`` property (``conf.get`` does not)."""
    (tmp_path / "bareapp.py").write_text("from celery import Celery\napp = Celery('bareapp')\n")
    broker = servers.lock.url.replace("/0", "/3")
    result = no_traceback(celery("-b", broker, "locks", "list", app="bareapp:app", cwd=tmp_path))
    assert result.returncode == 0, result.stderr
    assert f"on {broker} (from app 'bareapp', its broker_url)" in result.stderr


def test_the_lock_server_follows_celery_broker_url_in_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from celery import Celery as CeleryApp

    from celery_singleton_lock.celery.config.servers import choose_url

    monkeypatch.setenv("CELERY_BROKER_URL", "redis://from-env:6379/4")
    app = CeleryApp("envapp", broker="amqp://configured//")
    assert choose_url(app.conf) == ("redis://from-env:6379/4", "broker_url")
