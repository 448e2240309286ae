"""The ``celery-singleton-lock`` command: list and show the locks held now, release one.

The lock server is ``--url``, else the one the Celery app given with ``-A`` uses (the choice a
worker makes), else ``$SINGLETON_LOCK_URL``, else ``redis://localhost:6379/0``.

The work is done by plain functions taking a :class:`Target` (an inspector and the server it talks
to); the click commands only parse, call and print, and ``celery locks``
(:mod:`.command`) runs the very same command objects with the app Celery loaded. Every bad input
is one ``Error: ...`` line on stderr. Exit status: 0 done (an answer, a release), 1 nothing to
do (the lock is free, or changed hands before ``release``), 2 an error or a refused release.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, TypeVar

import click
import redis

from ..engine import LockHolder, LockInspector, LockKeys, RedisLocker
from ..engine.inspect import Client
from ..engine.keys import validate_prefix
from ..engine.quorum import QuorumLocker
from ..errors import LockBackendUnavailable, LockConfigurationError, LockError
from .lock_server import (
    DEFAULT_URL,
    check_url,
    choose_url,
    cluster_setting,
    make_client,
    make_locker,
    redact,
    redact_loosely,
    transport_options,
)
from .options import lock_prefix
from .quorum import quorum_urls
from .task import LockedTask

T = TypeVar("T")

#: ``list`` looks for locks under other prefixes with at most this many SCAN calls...
OTHER_PREFIX_SCANS = 100
#: ... of this COUNT each (so it looks at no more than about 100,000 keys).
OTHER_PREFIX_SCAN_COUNT = 1000
#: ... and names at most this many of the prefixes it finds.
OTHER_PREFIXES_SHOWN = 10

#: Seconds ``release`` waits, by default, for the holder's worker node to answer a ping.
PING_TIMEOUT = 2.0

EXIT_FREE = 1
EXIT_ERROR = 2


class ReleaseRefused(LockError):
    """``release`` will not release a lock whose holder may still be running."""


class CliError(click.ClickException):
    """One ``Error: ...`` line on stderr, exit status 2."""

    exit_code = EXIT_ERROR

    def __init__(self, message: str) -> None:
        # a message from Redis or from a user's module may span lines: keep it to one
        super().__init__(" ".join(str(message).split()))


# -- choosing the server ---------------------------------------------------------------------


def load_app(app_path: str) -> Any:
    """The Celery app ``app_path`` names, found as ``celery -A`` finds it (the current
    directory on ``sys.path``), with its configuration loaded.

    Raises:
        LockConfigurationError: one line saying why it could not be loaded.
    """
    from celery import Celery
    from celery.app.utils import find_app
    from celery.utils.imports import import_from_cwd

    module_name, _, attribute = app_path.partition(":")
    try:
        # find_app would retry "module:attr" as a module name, and report that one missing
        app = getattr(import_from_cwd(module_name), attribute) if attribute else find_app(app_path)
        if isinstance(app, Celery):
            app.conf.get("singleton_lock_prefix")  # a lazy config_from_object loads here
    except LockError as exc:  # a task's lock options, validated as the module defines it
        raise LockConfigurationError(f"cannot load app -A {app_path}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the user's module may raise anything on import
        raise LockConfigurationError(
            f"cannot load app -A {app_path}: {type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(app, Celery):
        raise LockConfigurationError(
            f"-A {app_path} is not a Celery app (it is {type(app).__name__}); "
            "give module:attribute of the Celery() instance"
        )
    return app


@dataclass
class Target:
    """An inspector and the server it reads, for the commands below."""

    inspector: LockInspector
    url: str
    #: where ``url`` came from, for the user: "--url", "-A proj:app, its broker_url"...
    source: str
    app: Any = None
    #: the quorum's locker when ``url`` names a Redlock quorum (its ``inspect`` is
    #: ``inspector``); None for one server
    quorum: Optional[QuorumLocker] = None

    @property
    def server(self) -> str:
        """The server, password hidden, and where its URL came from."""
        return f"{redact(self.url)} (from {self.source})"

    def close(self) -> None:
        if self.quorum is not None:
            self.quorum.close()
        else:
            self.inspector.client.close()

    def locker(self) -> RedisLocker:
        """A locker writing where ``inspector`` reads (every server of a quorum)."""
        if self.quorum is not None:
            return self.quorum
        return RedisLocker(self.inspector.client, prefix=self.inspector.prefix)


def open_target(
    *,
    url: Optional[str] = None,
    app: Any = None,
    app_label: str = "-A",
    prefix: Optional[str] = None,
) -> Target:
    """The server and prefix to inspect: ``url``, else ``app``'s lock server, else
    ``$SINGLETON_LOCK_URL``, else the default; ``prefix``, else ``app``'s, else the default.

    Raises:
        LockConfigurationError: a bad URL, prefix or app setting, said in one line.
    """
    options = None
    setting = "singleton_lock_url"  # whose transport options a Sentinel URL takes
    if url:
        source = "--url"
    elif app is not None:
        url, setting = choose_url(app.conf)
        source = (
            f"{app_label}, which names no Redis server: the default"
            if setting == "default"
            else f"{app_label}, its {setting}"
        )
    elif os.environ.get("SINGLETON_LOCK_URL"):
        url, source = os.environ["SINGLETON_LOCK_URL"], "$SINGLETON_LOCK_URL"
    else:
        url, source = DEFAULT_URL, "default: no --url, -A or $SINGLETON_LOCK_URL"
    if app is not None:
        options = app.conf.get("singleton_lock_redis_options")
        prefix = prefix if prefix is not None else lock_prefix(app.conf)
    prefix = validate_prefix(prefix if prefix is not None else "singleton-lock")
    sentinel_options = transport_options(app.conf, setting) if app is not None else None
    check_url(url, sentinel_options)
    if quorum_urls(url) is not None:
        locker = make_locker(url, options, None, cluster=False, prefix=prefix)
        assert isinstance(locker, QuorumLocker)
        return Target(inspector=locker.inspect, url=url, source=source, app=app, quorum=locker)
    try:
        client = make_client(
            url,
            options,
            sentinel_options,
            cluster=cluster_setting(app.conf) if app is not None else None,
        )
    except (ValueError, TypeError) as exc:  # what redis-py raises for a URL or option it refuses
        raise LockConfigurationError(f"cannot connect to {redact_loosely(url)}: {exc}") from None
    return Target(inspector=LockInspector(client, prefix=prefix), url=url, source=source, app=app)


# -- the commands' work ----------------------------------------------------------------------


def _asking(target: Target, call: Callable[[], T]) -> T:
    """``call()``, with server trouble said as one ``LockError`` naming the server."""
    try:
        return call()
    except LockBackendUnavailable as exc:
        raise LockBackendUnavailable(f"{exc}; server {target.server}") from None
    except redis.exceptions.RedisError as exc:  # e.g. a server too old for SCAN TYPE
        raise LockError(f"{type(exc).__name__}: {exc}; server {target.server}") from None


@dataclass
class Listing:
    """What ``list`` found."""

    holders: list[LockHolder]
    #: stopped at the limit: there may be more
    truncated: bool
    #: only looked for when nothing is held under the prefix in use
    other_prefixes: list[str]
    #: calls parked behind each holder's lock (policy ``queue``), in ``holders`` order
    parked: list[int] = field(default_factory=list)


def list_locks(target: Target, limit: int) -> Listing:
    """The locks held now under the target's prefix (SCAN, never KEYS), up to ``limit``; when
    there are none, the other prefixes that hold lock-shaped keys."""

    def collect() -> Listing:
        holders: list[LockHolder] = []
        for holder in target.inspector.scan():
            if len(holders) >= limit:
                return Listing(holders, True, [], parked_counts(holders))
            holders.append(holder)
        inspector = target.inspector
        others = [] if holders else lock_shaped_prefixes(inspector.client, inspector.prefix)
        return Listing(holders, False, others, parked_counts(holders))

    def parked_counts(holders: list[LockHolder]) -> list[int]:
        if target.quorum is not None:  # a quorum parks nothing (queue is refused there)
            return [0] * len(holders)
        return target.inspector.parked_counts([holder.key for holder in holders])

    return _asking(target, collect)


def _scan_strings(client: redis.Redis, match: str) -> Iterator[list[Any]]:
    """Batches of string keys matching ``match``, from a bounded number of SCAN calls."""
    cursor = 0
    for _ in range(OTHER_PREFIX_SCANS):
        cursor, keys = client.scan(
            cursor, match=match, count=OTHER_PREFIX_SCAN_COUNT, _type="string"
        )
        if keys:
            yield keys
        if cursor == 0:
            return


def lock_shaped_prefixes(client: Client, exclude: str) -> list[str]:
    """Prefixes other than ``exclude`` with lock-shaped keys: ``<prefix>:{<name>}`` strings
    whose value has ``|`` right after the 32-character token (see ``engine/scripts.py``).

    Bounded: at most ``OTHER_PREFIX_SCANS`` SCAN calls, never KEYS. None looked for on a
    Redis Cluster (a bounded SCAN there is one cursor per primary; the hint is not worth it).
    """
    if not isinstance(client, redis.Redis):
        return []
    found: set[str] = set()
    for batch in _scan_strings(client, "*:{*}"):
        pipe = client.pipeline(transaction=False)
        for key in batch:
            pipe.getrange(key, 32, 32)
        for key, mark in zip(batch, pipe.execute()):
            text = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
            prefix = text[: text.index(":{")]
            if mark in (b"|", "|") and prefix != exclude:
                found.add(prefix)
        if len(found) >= OTHER_PREFIXES_SHOWN:
            break
    return sorted(found)[:OTHER_PREFIXES_SHOWN]


def lock_name_from_key(target: Target, name: str) -> str:
    """The lock name in ``name``: a lock name, or the full key under the target's prefix.

    Raises:
        LockConfigurationError: a full key under another prefix (says which --prefix to use).
    """
    prefix = target.inspector.prefix
    if name.startswith(f"{prefix}:{{") and name.endswith("}"):
        return name[len(prefix) + 2 : -1]
    if ":{" in name and name.endswith("}"):
        other = name[: name.index(":{")]
        raise LockConfigurationError(
            f"key {name!r} is under prefix {other!r}, not {prefix!r}: add --prefix {other}"
        )
    return name


def lock_name_of_call(
    app: Any, task_name: str, args: Optional[list[Any]], kwargs: Optional[dict[str, Any]]
) -> str:
    """The lock name a call of ``task_name`` with ``args`` and ``kwargs`` takes: exactly what
    the task computes, ``task.lock_options.keyer.name(args, kwargs)``.

    Raises:
        LockConfigurationError: the task is unknown or takes no lock.
        LockKeyError: the arguments do not fit the task (said as the task would say it).
    """
    try:
        tasks = app.tasks
        if task_name not in tasks:
            # tasks of the ``imports`` / ``include`` settings, as a worker would load them
            app.loader.import_default_modules()
    except LockError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's task modules may raise anything
        raise LockConfigurationError(
            f"cannot load the app's tasks: {type(exc).__name__}: {exc}"
        ) from None
    task = tasks.get(task_name)
    if task is None:
        locked = [name for name, t in tasks.items() if isinstance(t, LockedTask)]
        close = difflib.get_close_matches(task_name, locked, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise LockConfigurationError(f"task {task_name!r} is not registered in the app{hint}")
    if not isinstance(task, LockedTask):
        raise LockConfigurationError(
            f"task {task_name!r} is not a LockedTask (base=LockedTask): it takes no lock"
        )
    return str(task.lock_options.keyer.name(args or [], kwargs or {}))


def read_lock(target: Target, name: str) -> tuple[Optional[LockHolder], int]:
    """The holder of lock ``name`` (None when free) and the last fence handed out for it."""
    LockKeys.build(target.inspector.prefix, name)  # a bad name is bad input, not server trouble
    return _asking(target, lambda: (target.inspector.read(name), target.inspector.fence(name)))


def holder_row(holder: LockHolder, now: float) -> str:
    """One line describing ``holder``."""
    age = "-" if holder.acquired_at is None else f"{max(0.0, now - holder.acquired_at):.1f}s"
    ttl = "none" if holder.ttl is None else f"{holder.ttl:.1f}s"
    fence = "-" if holder.fence is None else str(holder.fence)
    return (
        f"{holder.key}  task={holder.task_id or '-'}  host={holder.host or '-'}  "
        f"pid={holder.pid or '-'}  age={age}  ttl={ttl}  fence={fence}"
    )


def holder_json(holder: LockHolder, prefix: str) -> dict[str, Any]:
    """``holder`` as ``list --json`` prints it (``name`` is the lock name inside the key)."""
    name = holder.key[len(prefix) + 2 : -1] if holder.key.startswith(f"{prefix}:{{") else ""
    return {
        "key": holder.key,
        "name": name,
        "task_id": holder.task_id,
        "host": holder.host,
        "pid": holder.pid,
        "acquired_at": holder.acquired_at,
        "ttl": holder.ttl,
        "fence": holder.fence,
    }


def describe_holder(holder: LockHolder) -> str:
    """``task T on node N, pid P``: who holds a lock, for a sentence."""
    where = "node" if is_worker_node(holder.host) else "host"
    return f"task {holder.task_id or '-'} on {where} {holder.host or '-'}, pid {holder.pid or '-'}"


def is_worker_node(host: str) -> bool:
    """True if ``host`` is a Celery worker node name (``name@hostname``): a worker stores its
    node name as the holder's host, a process outside a worker its plain host name."""
    name, at, hostname = host.partition("@")
    return bool(name and at and hostname)


def node_is_alive(app: Any, node: str, timeout: float) -> bool:
    """True if the worker node ``node`` answers a control ping within ``timeout`` seconds.

    Raises:
        LockBackendUnavailable: the broker could not be asked (bounded by kombu's retries).
    """
    try:
        replies = app.control.ping(destination=[node], timeout=timeout, limit=1)
    except Exception as exc:  # noqa: BLE001 - a broker transport may raise anything: a refused
        # connection, an unknown scheme, a missing transport module
        raise LockBackendUnavailable(
            f"cannot ask worker node {node!r} whether it is alive: {type(exc).__name__}: {exc}; "
            "use --force to release without asking"
        ) from None
    return any(node in reply for reply in replies or [])


@dataclass
class Released:
    """What ``release`` did."""

    #: the holder read before releasing; None when the lock was free
    holder: Optional[LockHolder]
    released: bool
    #: when not released although held: who holds it now (None when it is free now)
    now: Optional[LockHolder] = None
    #: when released: calls parked behind it (policy ``queue``), made due for a hand-off
    parked: int = 0


def release_lock(
    target: Target, name: str, *, is_alive: Optional[Callable[[str], bool]]
) -> Released:
    """Release lock ``name`` if its holder is gone: owner-checked, never a blind ``DEL``.

    Reads the holder, asks ``is_alive(node)`` about the holder's worker node (None: do not
    ask, ``--force``), then releases with the engine's ``release_abandoned``: the key is
    deleted only if it still names that task, node and pid, and the release is published as
    any release is (waiters wake up). A lock that changed hands in between is left alone.

    Raises:
        ReleaseRefused: the holder's node answered, or it is no worker node that can be asked.
        LockNotOwnedError: the key holds data this package did not write.
    """
    LockKeys.build(target.inspector.prefix, name)  # a bad name is bad input, not server trouble
    holder = _asking(target, lambda: target.inspector.read(name))
    if holder is None:
        return Released(None, False)
    if holder.pid is None:
        raise ReleaseRefused(
            f"lock {holder.key}: its value names no pid, so no owner check can match it; "
            "it was not written by this package's release of a worker"
        )
    if is_alive is not None:
        if not is_worker_node(holder.host):
            raise ReleaseRefused(
                f"lock {holder.key} is held by {describe_holder(holder)}, which is not a Celery "
                "worker node (the lock was taken outside a worker): it cannot be asked whether "
                "it is alive; use --force to release anyway"
            )
        if is_alive(holder.host):
            raise ReleaseRefused(
                f"lock {holder.key} is held by {describe_holder(holder)} (alive: answered "
                "ping); use --force to release anyway"
            )
    inspector = target.inspector
    locker = target.locker()
    task_id, host, pid = holder.task_id, holder.host, holder.pid
    released = _asking(
        target, lambda: locker.release_abandoned(name, task_id=task_id, host=host, pid=pid)
    )
    if released:
        # calls parked behind it: a worker's sweeper hands the lock on at its next tick
        parked = (
            0 if target.quorum is not None else _asking(target, lambda: locker.hand_off_soon(name))
        )
        return Released(holder, True, parked=parked)
    return Released(holder, False, _asking(target, lambda: inspector.read(name)))


def _json_argument(option: str, text: str, kind: type) -> Any:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise LockConfigurationError(f"{option} is not valid JSON: {exc}") from None
    if not isinstance(value, kind):
        wanted = "a JSON list" if kind is list else "a JSON object"
        raise LockConfigurationError(f"{option} must be {wanted}, got {text!r}")
    return value


# -- click: parse, call, print ----------------------------------------------------------------


@dataclass
class Settings:
    """What the group's options (or ``celery``'s) chose, for the sub-commands: ``ctx.obj``."""

    url: Optional[str]
    app_path: Optional[str]
    prefix: Optional[str]
    app: Any = None
    #: how the app is named to the user; ``-A <app_path>`` by default
    app_label: Optional[str] = None

    def load_app(self) -> Any:
        if self.app is None and self.app_path:
            self.app = load_app(self.app_path)
        return self.app

    @property
    def has_app(self) -> bool:
        return self.app is not None or bool(self.app_path)

    def target(self) -> Target:
        return open_target(
            url=self.url,
            app=self.load_app(),
            app_label=self.app_label or f"-A {self.app_path}",
            prefix=self.prefix,
        )


@contextlib.contextmanager
def _one_line_errors() -> Iterator[None]:
    try:
        yield
    except LockError as exc:
        raise CliError(str(exc)) from None


class _OneLineGroup(click.Group):
    """Says a usage error (unknown option, bad --limit...) in one line, like every other error:
    click would print the usage and a hint first."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with _usage_in_one_line():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        with _usage_in_one_line():
            return super().invoke(ctx)


_NO_ARGS_IS_HELP: tuple[type[BaseException], ...] = tuple(
    getattr(click.exceptions, name)
    for name in ("NoArgsIsHelpError",)
    if hasattr(click.exceptions, name)
)


@contextlib.contextmanager
def _usage_in_one_line() -> Iterator[None]:
    try:
        yield
    except click.UsageError as exc:
        # no arguments at all: click (8.2+) shows the help, through a UsageError
        if exc.ctx is None or isinstance(exc, _NO_ARGS_IS_HELP):
            raise
        raise click.UsageError(
            f"{exc.format_message()} (see {exc.ctx.command_path} --help)"
        ) from None


@click.group(cls=_OneLineGroup)
@click.option(
    "--url", metavar="URL", help="Redis URL of the lock server: redis://, rediss:// or unix://."
)
@click.option(
    "-A",
    "--app",
    "app_path",
    metavar="MODULE:ATTR",
    help="Celery app to take the lock server and prefix from (found as celery -A finds it).",
)
@click.option(
    "--prefix",
    help="Key prefix of the locks (default: the app's, else singleton-lock).",
)
@click.pass_context
def main(
    ctx: click.Context, url: Optional[str], app_path: Optional[str], prefix: Optional[str]
) -> None:
    """Inspect celery-singleton-lock locks, release an abandoned one.

    The same commands as celery -A PROJ locks. The lock server is --url, else the one the
    Celery app given with -A uses (as its workers choose it), else $SINGLETON_LOCK_URL, else
    redis://localhost:6379/0. Every command names the server it queried on stderr.

    Exit status: 0 done, 1 nothing to do (the lock is free), 2 an error or a refused release.
    """
    ctx.obj = Settings(url, app_path, prefix)


@main.command(name="list")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Stop after this many locks.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON document: the list of holders (key, name, task_id, host, pid, "
    "acquired_at, ttl, fence, parked).",
)
@click.pass_obj
def list_command(settings: Settings, limit: int, as_json: bool) -> None:
    """List the locks held now (SCAN, never KEYS).

    When none are held under the prefix in use, also names the other prefixes that hold
    locks (a bounded SCAN).
    """
    with _one_line_errors():
        target = settings.target()
        try:
            listing = list_locks(target, limit)
        finally:
            target.close()
    if as_json:
        prefix = target.inspector.prefix
        rows = [
            {**holder_json(holder, prefix), "parked": parked}
            for holder, parked in zip(listing.holders, listing.parked)
        ]
        click.echo(json.dumps(rows))
    else:
        now = time.time()
        for holder, parked in zip(listing.holders, listing.parked):
            click.echo(holder_row(holder, now) + (f"  parked={parked}" if parked else ""))
    summary = (
        f"{len(listing.holders)} lock(s) held under prefix {target.inspector.prefix!r} "
        f"on {target.server}"
    )
    if listing.truncated:
        summary += f"; stopped after {limit} (--limit), there may be more"
    if listing.other_prefixes:
        summary += (
            "; found lock-shaped keys under prefixes: "
            f"{', '.join(map(repr, listing.other_prefixes))} (use --prefix)"
        )
    click.echo(summary, err=True)


NEEDS_APP = (
    "show --task needs -A MODULE:ATTR: the lock name is a hash of the call's arguments bound "
    "to the task's signature (and its lock_on / lock_key), which only the app knows; or "
    "compute it in Python, app.tasks[TASKNAME].lock_options.keyer.name(args, kwargs), and "
    "give it as NAME"
)


@main.command()
@click.argument("name", required=False)
@click.option(
    "--task",
    "task_name",
    metavar="TASKNAME",
    help="Show the lock a call of this task takes (needs -A).",
)
@click.option(
    "--args", "args_json", metavar="JSON", help="With --task: the positional arguments, a list."
)
@click.option(
    "--kwargs",
    "kwargs_json",
    metavar="JSON",
    help="With --task: the keyword arguments, an object.",
)
@click.pass_obj
def show(
    settings: Settings,
    name: Optional[str],
    task_name: Optional[str],
    args_json: Optional[str],
    kwargs_json: Optional[str],
) -> None:
    """Show who holds one lock.

    NAME is a lock name (TASKNAME:DIGEST, as list shows it between the braces) or its full
    key (PREFIX:{TASKNAME:DIGEST}). Or, with -A, give --task and the call's --args and
    --kwargs as JSON: the name is computed exactly as the task computes it, e.g.

    \b
      celery -A proj locks show --task proj.tasks.rebuild \\
          --args '[42]' --kwargs '{"full": true}'
      celery-singleton-lock -A proj.celery:app show --task proj.tasks.rebuild ...

    Calls parked behind the lock (on_duplicate='queue') are listed after it, by task id,
    oldest first. Exit status 1 when the lock is free.
    """
    with _one_line_errors():
        if (name is None) == (task_name is None):
            raise LockConfigurationError("give either a lock NAME or --task TASKNAME")
        if task_name is None and (args_json is not None or kwargs_json is not None):
            raise LockConfigurationError("--args and --kwargs go with --task TASKNAME")
        if task_name is not None:
            args = _json_argument("--args", args_json or "[]", list)
            kwargs = _json_argument("--kwargs", kwargs_json or "{}", dict)
            if not settings.has_app:
                raise LockConfigurationError(NEEDS_APP)
            name = lock_name_of_call(settings.load_app(), task_name, args, kwargs)
        assert name is not None
        target = settings.target()
        try:
            name = lock_name_from_key(target, name)
            holder, fence = read_lock(target, name)
            views = None if target.quorum is None else target.quorum.inspect.per_server(name)
            inspector = target.inspector
            parked = [] if views is not None else _asking(target, lambda: inspector.parked(name))
        finally:
            target.close()
    click.echo(f"lock {name} under prefix {target.inspector.prefix!r} on {target.server}", err=True)
    for server, seen in views or ():  # a quorum: what each server holds
        shown = seen if isinstance(seen, Exception) else "free" if seen is None else None
        click.echo(f"  {server}: {shown or holder_row(seen, time.time())}", err=True)
    if holder is None:
        key = LockKeys.build(target.inspector.prefix, name).lock
        click.echo(f"{key}: free (last fence {fence})")
    else:
        click.echo(holder_row(holder, time.time()))
    if parked:
        click.echo(f"parked: {len(parked)} call(s), oldest first: {' '.join(parked)}")
    if holder is None:
        raise SystemExit(EXIT_FREE)


@main.command()
@click.argument("name")
@click.option(
    "--force",
    is_flag=True,
    help="Release without asking the holder's worker node (the owner check still applies).",
)
@click.option(
    "--ping-timeout",
    type=click.FloatRange(min=0.1, max=60),
    default=PING_TIMEOUT,
    show_default=True,
    help="Seconds to wait for the holder's worker node to answer a ping.",
)
@click.pass_obj
def release(settings: Settings, name: str, force: bool, ping_timeout: float) -> None:
    """Release a lock whose holder is gone.

    NAME is a lock name or its full key, as list shows them. Safe by default: reads the
    holder (task id, worker node, pid), refuses while that node answers a ping, and deletes
    the key only if it still names that holder (a lock taken again in the meantime is left
    alone). --force skips the ping, never the owner check.

    Exit status 0 released, 1 nothing released (free, or it changed hands), 2 refused or an
    error.
    """
    with _one_line_errors():
        if not force and not settings.has_app:
            raise LockConfigurationError(
                "release needs -A MODULE:ATTR to ask the holder's worker node whether it is "
                "alive (through the app's broker); or give --force to release without asking"
            )
        app = settings.load_app()

        def answers_ping(node: str) -> bool:
            return node_is_alive(app, node, ping_timeout)

        target = settings.target()
        try:
            name = lock_name_from_key(target, name)
            outcome = release_lock(target, name, is_alive=None if force else answers_ping)
        finally:
            target.close()
    key = LockKeys.build(target.inspector.prefix, name).lock
    click.echo(f"lock {name} under prefix {target.inspector.prefix!r} on {target.server}", err=True)
    if outcome.holder is None:
        click.echo(f"{key}: free, nothing to release")
        raise SystemExit(EXIT_FREE)
    if not outcome.released:
        now = "free now" if outcome.now is None else f"held by {describe_holder(outcome.now)}"
        click.echo(
            f"{key}: not released, it changed hands since it was read "
            f"(was {describe_holder(outcome.holder)}; {now})"
        )
        raise SystemExit(EXIT_FREE)
    how = (
        "--force: its node was not asked"
        if force
        else f"its node did not answer a ping within {ping_timeout:g}s"
    )
    click.echo(f"{key}: released (held by {describe_holder(outcome.holder)}; {how})")
    if outcome.parked:
        click.echo(
            f"{key}: {outcome.parked} call(s) parked behind it: a worker's hand-off sweeper "
            "hands the lock to the oldest at its next sweep (singleton_lock_handoff_sweep_interval)"
        )


def clear_queued_marker(target: Target, name: str) -> Optional[str]:
    """Delete the enqueue marker of lock ``name`` (``dedupe_on_enqueue``) if it still names the
    task id read first (compare-and-delete); that task id, or None when there was none."""
    LockKeys.build(target.inspector.prefix, name)  # a bad name is bad input, not server trouble
    locker = target.locker()
    queued = _asking(target, lambda: locker.queued(name))
    if queued is None or not _asking(target, lambda: locker.clear_queued(name, queued)):
        return None
    return queued


@main.command(name="clear-queued")
@click.argument("name")
@click.pass_obj
def clear_queued(settings: Settings, name: str) -> None:
    """Delete the enqueue marker of a lock (dedupe_on_enqueue).

    A call of a task with dedupe_on_enqueue leaves a marker naming its task id until a worker
    takes the lock; while it is there, the same call is not published again. A message that
    was purged or lost never reaches a worker, and its marker then blocks new calls until
    lock_queued_ttl passes. This deletes it now, if it still names the task it named when
    read. Exit status 0 cleared, 1 there was none.
    """
    with _one_line_errors():
        target = settings.target()
        try:
            name = lock_name_from_key(target, name)
            cleared = clear_queued_marker(target, name)
        finally:
            target.close()
    click.echo(f"lock {name} under prefix {target.inspector.prefix!r} on {target.server}", err=True)
    if cleared is None:
        click.echo(f"{name}: no enqueue marker")
        raise SystemExit(EXIT_FREE)
    click.echo(f"{name}: enqueue marker of task {cleared} deleted; the next call is published")


if __name__ == "__main__":
    main()
