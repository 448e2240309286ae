"""``celery locks --url URL ...``: the lock commands as a user without an app module runs them
(no ``-A``: Celery's default app), against a real Redis. With an app (``celery -A proj locks``)
they are tests/celery/test_celery_locks.py's.

Most run in this process (:func:`cli`: Celery's own ``celery`` click group, as ``celery``
without ``-A`` runs it, each with a fresh default app): a ``celery`` process adds an import of
Celery (1-2 s) and nothing these commands read. The tests of what only a process has (the
entry point, the environment it starts with, an app module in its current directory, its exit
status) run the real ``celery`` (:func:`run_cli`).

Every bad input must give exactly one ``Error: ...`` line on stderr, no traceback, and a
non-zero exit; every answer names the server it came from on stderr.
"""

# The fixture of test_celery_locks.py is imported by name: a test argument names it.
# ruff: noqa: F811

from __future__ import annotations

import copy
import importlib
import inspect
import json
import os
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path
from typing import Any, Optional
from unittest import mock

import click
import pytest
import redis
from celery import Celery
from celery.bin.celery import celery as celery_group
from click.testing import CliRunner

from celery_singleton_lock.celery import lock_acquired
from celery_singleton_lock.engine import Owner, RedisLocker, Renewer
from celery_singleton_lock.testing import RedisServer
from tests.celery.conftest import lock_key_of
from tests.celery.tasks import exits
from tests.celery.test_celery_locks import (  # noqa: F401 - the fixture
    declared_celery_commands,
    entry_points_dir,
)
from tests.celery.workers import results_url

REPO = Path(__file__).resolve().parents[2]

#: Where the distribution declaring pyproject.toml's ``celery.commands`` entry points is
#: (test_celery_locks.py's ``entry_points_dir``), set once by the autouse fixture below.
_ENTRY_POINTS: list[Path] = []


@pytest.fixture(scope="module", autouse=True)
def _celery_finds_locks(entry_points_dir: Path) -> None:
    _ENTRY_POINTS[:] = [entry_points_dir]


def run_cli(
    *args: str,
    app: Optional[str] = None,
    cwd: Optional[Path] = None,
    env: Optional[dict[str, str]] = None,
) -> subprocess.CompletedProcess[str]:
    """``celery [-A app] locks *args``, with none of the settings of the environment."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("CSL_", "CELERY_"))}
    environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [*map(str, _ENTRY_POINTS), str(REPO), environ.get("PYTHONPATH")])
    )
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "celery", *(["-A", app] if app else []), "locks", *args],
        cwd=cwd or REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


def stderr_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def the_error(result: subprocess.CompletedProcess[str]) -> str:
    """The one ``Error:`` line of a failed run (asserting there is nothing else)."""
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = stderr_lines(result)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: "), result.stderr
    return lines[0]


# -- the same commands in this process -----------------------------------------------------------

BAD_URLS = {
    "http-scheme": ("http://x", "not a Redis URL"),
    "no-scheme": ("notaurl", "not a Redis URL"),
    "db-not-a-number": ("redis://127.0.0.1/abc", "database 'abc' is not a number"),
    "port-not-a-number": ("redis://127.0.0.1:port/0", "port"),
}
HELP_OF = ([], ["list"], ["show"], ["release"])
LOCKAPP = "tests.celery.lockapp:app"


def _celery_with_locks() -> click.Group:
    """Celery's ``celery`` group with the ``locks`` group pyproject.toml's entry point names (as
    the ``celery`` of an installed distribution has it), the group of Celery left as it is."""
    module, _, attribute = declared_celery_commands()["locks"].partition(":")
    group = copy.copy(celery_group)
    group.commands = {
        **celery_group.commands,
        "locks": getattr(importlib.import_module(module), attribute),
    }
    return group


#: click before 8.2 (the oldest corner's 8.1.2) mixes stderr into the output unless told not
#: to; 8.2 removed the option and always keeps them apart
_STDERR_APART: dict[str, Any] = (
    {"mix_stderr": False} if "mix_stderr" in inspect.signature(CliRunner).parameters else {}
)


def cli(*args: str, app: Optional[str] = None) -> subprocess.CompletedProcess[str]:
    """``celery [-A app] locks *args`` as :func:`run_cli` runs it, in this process: Celery's
    ``celery`` group with its ``main``'s settings, without ``-A`` a fresh default app (Celery
    makes one in each new process), ``sys.argv`` as ``celery`` sees it and none of the
    ``CSL_``/``CELERY_`` settings of the environment. An exception the process would print is
    a traceback on stderr here too, and the exit status is the one the process would have."""
    argv = ["celery", *(["-A", app] if app else []), "locks", *args]
    hidden: dict[str, Optional[str]] = {
        name: None for name in os.environ if name.startswith(("CSL_", "CELERY_"))
    }
    with mock.patch.object(sys, "argv", argv):
        result = CliRunner(**_STDERR_APART).invoke(
            _celery_with_locks(),
            argv[1:],
            prog_name="celery",
            env=hidden,
            auto_envvar_prefix="CELERY",
            default_map=None
            if app
            else {"app": Celery("default", fixups=[], set_as_current=False)},
        )
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        assert result.exc_info is not None
        stderr += "".join(traceback.format_exception(*result.exc_info))
    return subprocess.CompletedProcess(argv, result.exit_code, result.stdout, stderr)


def _locker(server: RedisServer, prefix: str = "singleton-lock") -> RedisLocker:
    return RedisLocker(server.client(), prefix=prefix, renewer=Renewer(autostart=False))


# -- answers ----------------------------------------------------------------------------------


def test_list_shows_every_held_lock_with_its_holder(redis_server: RedisServer) -> None:
    locker = _locker(redis_server)
    locker.try_acquire("app.job:aa", 30, owner=Owner(task_id="t-1", host="w1", pid=11))
    locker.try_acquire(
        "app.job:bb", 30, owner=Owner(task_id="t-2", host="w2", pid=22), fencing=True
    )
    result = cli("--url", redis_server.url, "list")
    assert result.returncode == 0, result.stderr
    assert "singleton-lock:{app.job:aa}  task=t-1  host=w1  pid=11" in result.stdout
    assert "task=t-2" in result.stdout and "fence=1" in result.stdout
    assert "2 lock(s) held" in result.stderr


def test_list_names_the_server_it_queried(redis_server: RedisServer) -> None:
    result = cli("--url", redis_server.url, "list")
    assert result.returncode == 0, result.stderr
    assert f"on {redis_server.url} (from --url)" in result.stderr


def test_list_hides_the_password_of_the_server_it_names() -> None:
    with RedisServer.running(password="s3cret-pw") as server:
        result = cli("--url", server.url, "list")
    assert result.returncode == 0, result.stderr
    assert f"redis://:***@127.0.0.1:{server.port}/0" in result.stderr
    assert "s3cret-pw" not in result.stderr + result.stdout


def test_list_names_the_default_server_when_given_none() -> None:
    # read-only, whatever (if anything) answers on the default address
    result = cli("list")
    assert "redis://localhost:6379/0" in result.stderr
    assert "Traceback" not in result.stderr


def test_list_names_the_server_taken_from_the_environment(redis_server: RedisServer) -> None:
    # Celery's default app takes its broker from $CELERY_BROKER_URL (or celery -b)
    result = run_cli("list", env={"CELERY_BROKER_URL": redis_server.url})
    assert result.returncode == 0, result.stderr
    assert (
        f"on {redis_server.url} (from Celery's default app (no -A), its broker_url)"
        in result.stderr
    )


def test_list_under_the_wrong_prefix_names_the_prefixes_holding_locks(
    redis_server: RedisServer,
) -> None:
    _locker(redis_server, prefix="singleton-lock").try_acquire("app.job:ee", 30)
    _locker(redis_server, prefix="other/app").try_acquire("app.job:ff", 30)
    redis_server.client().set("elsewhere:{not-a-lock}", "plain value")
    result = cli("--url", redis_server.url, "--prefix", "mine", "list")
    assert result.returncode == 0, result.stderr
    assert "0 lock(s) held under prefix 'mine'" in result.stderr
    assert (
        "found lock-shaped keys under prefixes: 'other/app', 'singleton-lock' (use --prefix)"
        in result.stderr
    )
    assert "elsewhere" not in result.stderr


def test_show_of_a_free_lock_exits_1(redis_server: RedisServer) -> None:
    result = run_cli("--url", redis_server.url, "show", "app.job:zz")
    assert result.returncode == 1
    assert "free" in result.stdout


def test_show_accepts_the_full_key(redis_server: RedisServer) -> None:
    _locker(redis_server).try_acquire("app.job:cc", 30, owner=Owner(task_id="t-3"))
    result = cli("--url", redis_server.url, "show", "singleton-lock:{app.job:cc}")
    assert result.returncode == 0, result.stderr
    assert "task=t-3" in result.stdout


def test_show_names_the_server_it_queried(redis_server: RedisServer) -> None:
    _locker(redis_server).try_acquire("app.job:gg", 30)
    result = cli("--url", redis_server.url, "show", "app.job:gg")
    assert result.returncode == 0, result.stderr
    assert f"on {redis_server.url} (from --url)" in result.stderr


def test_list_and_show_only_read(redis_server: RedisServer) -> None:
    client: redis.Redis = redis_server.client()
    _locker(redis_server).try_acquire("app.job:dd", 30)
    before = {k: client.pttl(k) for k in client.scan_iter()}
    cli("--url", redis_server.url, "list")
    cli("--url", redis_server.url, "show", "app.job:dd")
    after = {k: client.pttl(k) for k in client.scan_iter()}
    assert before.keys() == after.keys()


def test_an_app_module_in_the_current_directory_is_found(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    (tmp_path / "newapp.py").write_text(
        textwrap.dedent(
            f"""
            from celery import Celery
            app = Celery("newapp")
            app.conf.singleton_lock_url = {redis_server.url!r}
            app.conf.singleton_lock_prefix = "newapp-locks"
            """
        )
    )
    result = run_cli("list", app="newapp:app", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"0 lock(s) held under prefix 'newapp-locks' on {redis_server.url}" in result.stderr


def test_help_text_is_plain() -> None:
    for command in HELP_OF:
        result = cli(*command, "--help")
        assert result.returncode == 0, result.stderr
        assert "``" not in result.stdout, result.stdout


# -- release ----------------------------------------------------------------------------------


def test_release_without_an_app_to_ask_the_node_is_one_error_line(
    redis_server: RedisServer,
) -> None:
    _locker(redis_server).try_acquire("app.job:rr", 30, owner=Owner(task_id="t-r", host="w@h"))
    line = the_error(run_cli("--url", redis_server.url, "release", "app.job:rr"))
    assert "-A" in line and "--force" in line
    assert redis_server.client().exists("singleton-lock:{app.job:rr}") == 1


def test_forced_release_needs_no_app(redis_server: RedisServer) -> None:
    _locker(redis_server).try_acquire("app.job:rs", 30, owner=Owner(task_id="t-s", host="w@h"))
    result = cli("--url", redis_server.url, "release", "--force", "app.job:rs")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert redis_server.client().exists("singleton-lock:{app.job:rs}") == 0


# -- show --task: the lock name of a call ------------------------------------------------------


def test_show_task_finds_the_lock_a_running_task_holds(
    celery_app: Any, broker_server: RedisServer, lock_server: RedisServer, unique_key: str
) -> None:
    """The CLI runs while the task holds its lock (from the ``lock_acquired`` signal)."""
    task = exits.long_running
    seen: list[tuple[str, subprocess.CompletedProcess[str]]] = []

    def run_the_cli(sender: Any = None, key: str = "", **_: Any) -> None:
        if getattr(sender, "name", None) == task.name:
            seen.append(
                (
                    key,
                    run_cli(
                        "show",
                        "--task",
                        task.name,
                        "--args",
                        json.dumps([unique_key]),
                        "--kwargs",
                        json.dumps({"seconds": 0}),
                        app=LOCKAPP,
                        env={
                            "CSL_BROKER_URL": broker_server.url,
                            "CSL_BACKEND_URL": results_url(broker_server.url),
                            "CSL_LOCK_URL": lock_server.url,
                        },
                    ),
                )
            )

    lock_acquired.connect(run_the_cli, weak=False)
    try:
        outcome = task.apply(args=[unique_key], kwargs={"seconds": 0}, task_id=unique_key)
    finally:
        lock_acquired.disconnect(run_the_cli)
    assert outcome.successful()
    [(held_key, result)] = seen
    assert held_key == lock_key_of(task, unique_key, seconds=0)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{held_key}  task={unique_key}  "), result.stdout


def test_show_task_without_an_app_says_how_to_name_the_lock(redis_server: RedisServer) -> None:
    result = cli("--url", redis_server.url, "show", "--task", "proj.tasks.job", "--args", "[1]")
    line = the_error(result)
    assert "-A" in line and "lock_options.keyer.name(args, kwargs)" in line


def test_show_task_with_args_that_are_not_json_is_one_error_line() -> None:
    # a real process: ``-A`` of the lockapp in this process would load the app the shared
    # in-process worker runs (a STARTED state went missing in a later test when it did)
    line = the_error(run_cli("show", "--task", "x", "--args", "[1", app=LOCKAPP))
    assert "--args" in line and "JSON" in line


def test_show_of_a_key_under_another_prefix_is_one_error_line(redis_server: RedisServer) -> None:
    line = the_error(cli("--url", redis_server.url, "show", "other:{app.job:cc}"))
    assert "--prefix other" in line


# -- bad input: one line, no traceback -------------------------------------------------------


@pytest.mark.parametrize(("url", "says"), BAD_URLS.values(), ids=BAD_URLS)
def test_a_bad_url_is_one_error_line(url: str, says: str) -> None:
    line = the_error(cli("--url", url, "list"))
    assert says in line


def test_an_unreachable_server_is_one_error_line(redis_server: RedisServer) -> None:
    url = redis_server.url
    redis_server.stop()
    line = the_error(cli("--url", url, "list"))
    assert "unavailable" in line and url in line


def test_an_unreachable_server_is_one_error_line_for_show(redis_server: RedisServer) -> None:
    url = redis_server.url
    redis_server.stop()
    line = the_error(cli("--url", url, "show", "app.job:aa"))
    assert "unavailable" in line and url in line


def test_rediss_to_a_plain_server_is_one_error_line_naming_the_mismatch(
    redis_server: RedisServer,
) -> None:
    client = redis_server.client()
    before = int(client.info("stats")["total_connections_received"])
    url = redis_server.url.replace("redis://", "rediss://", 1)
    line = the_error(cli("--url", url, "list"))
    after = int(client.info("stats")["total_connections_received"])
    assert "speaks plain Redis, not TLS" in line and "correct the scheme in --url" in line
    # one TLS handshake and one plain PING, as a starting worker: not a handshake per retry
    assert after - before == 2


def test_an_unresolvable_host_is_one_error_line_naming_host_and_setting() -> None:
    line = the_error(cli("--url", "redis://no-such-host.invalid:6379/0", "list"))
    assert "lock server no-such-host.invalid:6379: the host name does not resolve" in line
    assert "correct the host in --url" in line


def test_a_limit_below_one_is_one_error_line(redis_server: RedisServer) -> None:
    line = the_error(cli("--url", redis_server.url, "list", "--limit", "0"))
    assert "--limit" in line


# -- limit (a live cap) ------------------------------------------------------------------------


def test_limit_sets_shows_and_resets_a_tasks_live_cap(redis_server: RedisServer) -> None:
    set_cap = cli("--url", redis_server.url, "limit", "proj.export", "2")
    assert set_cap.returncode == 0, set_cap.stderr
    assert "live cap of proj.export: 2" in set_cap.stdout
    assert redis_server.client().hget("singleton-lock:cap:proj.export", "cap") == b"2"
    assert (
        "live cap of proj.export: 2"
        in cli("--url", redis_server.url, "limit", "proj.export").stdout
    )
    reset = cli("--url", redis_server.url, "limit", "proj.export", "--reset")
    assert "live cap of proj.export: none" in reset.stdout
    assert redis_server.client().exists("singleton-lock:cap:proj.export") == 0


def test_show_names_the_live_cap_of_a_locks_task(redis_server: RedisServer) -> None:
    redis_server.client().hset("singleton-lock:cap:proj.export", "cap", 1)
    result = cli("--url", redis_server.url, "show", "proj.export:ab")
    assert "live cap: 1 slot(s) taken at most" in result.stdout


def test_pause_then_resume_say_what_holds_now(redis_server: RedisServer) -> None:
    paused = cli("--url", redis_server.url, "pause", "proj.export", "--for", "60")
    assert "proj.export: paused for" in paused.stdout, paused.stderr
    resumed = cli("--url", redis_server.url, "resume", "proj.export")
    assert "proj.export: not paused" in resumed.stdout


def test_list_names_a_paused_task(redis_server: RedisServer) -> None:
    cli("--url", redis_server.url, "pause", "proj.report")
    try:
        result = cli("--url", redis_server.url, "list")
        assert "proj.report: paused: no start until `celery locks resume`" in result.stdout
    finally:
        cli("--url", redis_server.url, "resume", "proj.report")


def test_limit_refuses_a_cap_below_one(redis_server: RedisServer) -> None:
    result = cli("--url", redis_server.url, "limit", "proj.export", "0")
    assert result.returncode == 2 and "0 is not in the range x>=1" in result.stderr


# -- clear-queued -----------------------------------------------------------------------------


def test_clear_queued_deletes_the_enqueue_marker_so_the_next_call_is_published(
    redis_server: RedisServer,
) -> None:
    locker = _locker(redis_server)
    assert (
        locker.markers.enqueue("app.job:aa", "lost-message", 3600) is None
    )  # the marker is written
    assert locker.markers.enqueue("app.job:aa", "next-call", 3600) == "lost-message"  # it blocks
    result = cli("--url", redis_server.url, "clear-queued", "app.job:aa")
    assert result.returncode == 0, result.stderr
    assert "lost-message" in result.stdout
    assert locker.markers.enqueue("app.job:aa", "next-call", 3600) is None


def test_show_names_the_enqueue_marker_of_a_free_lock_and_how_to_clear_it(
    redis_server: RedisServer,
) -> None:
    _locker(redis_server).markers.enqueue("app.job:aa", "lost-message", 3600)
    result = cli("--url", redis_server.url, "show", "app.job:aa")
    assert result.returncode == 1, result.stderr  # free
    assert "queued: task lost-message (dedupe_on_enqueue marker, expires in" in result.stdout
    assert "clear-queued app.job:aa" in result.stdout


def test_clear_queued_without_a_marker_exits_1(redis_server: RedisServer) -> None:
    result = cli("--url", redis_server.url, "clear-queued", "app.job:none")
    assert result.returncode == 1, result.stderr
    assert "no enqueue marker" in result.stdout


# -- calls parked behind a lock (on_duplicate='queue') -----------------------------------------


def _park(locker: RedisLocker, name: str, task_id: str) -> None:
    locker.try_acquire(name, 30, owner=Owner(task_id=task_id), renew=False, park=b"message")


def test_list_and_show_name_the_calls_parked_behind_a_lock(redis_server: RedisServer) -> None:
    locker = _locker(redis_server)
    holder = Owner(task_id="t-h", host="w@h", pid=7)
    locker.try_acquire("app.job:pk", 30, owner=holder, slotted=True)  # a queue task's lock
    for task_id in ("t-p1", "t-p2"):
        _park(locker, "app.job:pk", task_id)
    listed = cli("--url", redis_server.url, "list")
    assert "task=t-h" in listed.stdout and "parked=2" in listed.stdout
    as_json = json.loads(cli("--url", redis_server.url, "list", "--json").stdout)
    assert [row["parked"] for row in as_json] == [2]
    shown = cli("--url", redis_server.url, "show", "app.job:pk")
    assert shown.returncode == 0, shown.stderr
    assert "parked: 2 call(s), oldest first: t-p1 t-p2" in shown.stdout


def test_release_of_a_lock_with_parked_calls_makes_it_due_for_a_hand_off_now(
    redis_server: RedisServer,
) -> None:
    locker = _locker(redis_server)
    holder = Owner(task_id="t-h", host="w@h", pid=7)
    locker.try_acquire("app.job:pr", 30, owner=holder, slotted=True)  # a queue task's lock
    _park(locker, "app.job:pr", "t-p1")
    assert locker.queue.hand_off_due().names == []  # not before the holder's TTL of 30 s
    result = cli("--url", redis_server.url, "release", "--force", "app.job:pr")
    assert result.returncode == 0, result.stderr
    assert "1 call(s) parked behind it" in result.stdout
    assert locker.queue.hand_off_due().names == [
        "app.job:pr"
    ]  # a sweeper hands it on at its next tick


def test_locks_pause_on_a_redlock_quorum_is_refused_naming_it() -> None:
    """Each master would keep a rule of its own: no live rule on a quorum (a Cluster has one)."""
    with RedisServer.running() as a, RedisServer.running() as b, RedisServer.running() as c:
        result = cli("--url", ",".join(s.url for s in (a, b, c)), "pause", "proj.job")
    assert result.returncode != 0
    assert "not a Redlock quorum (each master would keep a rule of its own" in result.stderr
