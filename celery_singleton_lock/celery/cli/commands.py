"""``celery locks list / show / release / clear-queued`` (``limit``, ``pause``, ``resume``:
:mod:`.live_rule_commands`): the locks held now, release one.

The lock server is ``--url``, else the one the Celery app uses (the choice a worker makes).
The work is done by plain functions taking a :class:`Target` (an inspector and the server it
talks to); the click commands only parse, call and print. The group that runs them, with the
app Celery loaded, is :mod:`celery_singleton_lock.command_line`. Every bad input is one
``Error: ...`` line on stderr. Exit status: 0 done (an answer, a release), 1 nothing to do (the
lock is free, or changed hands before ``release``), 2 an error or a refused release.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import time
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import click

from celery_singleton_lock.celery.cli.app_target import (
    EXIT_FREE,
    CliError,
    Target,
    asking,
    open_target,
)
from celery_singleton_lock.celery.cli.lock_listing import (
    LockStream,
    describe_holder,
    holder_json,
    holder_row,
    lock_name_from_key,
    lock_name_of_call,
    pause_line,
    queued_line,
    rate_row,
    read_live_rules,
    read_lock,
    read_slots,
    refuse_a_name_no_task_takes,
    rule_json,
    waiting_line,
)
from celery_singleton_lock.celery.cli.lock_release import (
    FORCE_HINT,
    PING_TIMEOUT,
    Released,
    clear_queued_marker,
    node_is_alive,
    ping_timeout_option,
    release_command,
    release_lock,
)
from celery_singleton_lock.celery.config.urls import redact_loosely
from celery_singleton_lock.engine import LiveRule, LockKeys, PartsReader
from celery_singleton_lock.errors import LockConfigurationError, LockError


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
    """What the group's options (and ``celery``'s) chose, for the sub-commands: ``ctx.obj``."""

    #: the app Celery loaded: the one ``-A`` names, else Celery's default app
    app: Any
    #: ``-A`` (or ``$CELERY_APP``) was given. Celery's default app has no tasks: without one,
    #: any name may be a lock's (the engine's own), and no node is asked before a release
    app_given: bool
    url: Optional[str]
    prefix: Optional[str]
    #: how the app is named to the user
    app_label: str
    #: the command line up to the group's options, for the commands a report suggests
    program: str = "celery locks"

    @property
    def user_app(self) -> Any:
        """The app ``-A`` names, or None."""
        return self.app if self.app_given else None

    @property
    def invocation(self) -> str:
        """The command line that runs a sub-command the way this one ran (app, server,
        prefix), for the commands a report suggests (its password hidden)."""
        words = [self.program]
        if self.url:
            words.append(f"--url {shlex.quote(redact_loosely(self.url))}")
        if self.prefix:
            words.append(f"--prefix {shlex.quote(self.prefix)}")
        return " ".join(words)

    def target(self) -> Target:
        return open_target(url=self.url, app=self.app, app_label=self.app_label, prefix=self.prefix)


@contextlib.contextmanager
def _one_line_errors() -> Iterator[None]:
    try:
        yield
    except LockError as exc:
        raise CliError(str(exc)) from None


@click.command(name="list")
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
    "acquired_at, ttl, fence, slot, cooldown, cooldown_left, parked, rate_starts, and their "
    "task's or group's live_cap, paused, paused_until); with --rules, the list of live rules "
    "(family, live_cap, paused, paused_for, paused_until).",
)
@click.option(
    "--rules",
    "only_rules",
    is_flag=True,
    help="List only the live caps and pauses of tasks and groups (celery locks limit / pause), "
    "also those of a paused task that holds no lock.",
)
@click.option(
    "--scan",
    "by_scan",
    is_flag=True,
    help="Read the keys by SCAN (O(keys in the database)) rather than the held index: for locks "
    "taken by workers of an older version, which write no index, during a rolling upgrade.",
)
@click.pass_obj
def list_command(
    settings: Settings, limit: int, as_json: bool, only_rules: bool, by_scan: bool
) -> None:
    """List the locks held now, printed as they are read (a page at a time), then the live
    caps and pauses of tasks and groups (celery locks limit / pause, with when each pause
    ends; with --json, beside each holder of a task or group that has one).

    On one server (or Sentinel) they are read from the held index the lock scripts keep
    (O(held locks)); on a Redis Cluster by SCAN of every primary (never KEYS). When none are
    held under the prefix in use, also names the other prefixes that hold locks (a bounded
    SCAN).
    """
    with _one_line_errors():
        target = settings.target()
        try:
            live = read_live_rules(target)  # one read: beside the holders of --json
            if only_rules:
                _print_rules(live, as_json)
                return
            listing = LockStream(target, limit, by_scan=by_scan)
            _print_pages(listing, target.inspector.prefix, live if as_json else None)
        finally:
            target.close()
    if not as_json:
        _print_rules(live, False)
    summary = (
        f"{listing.count} lock(s) held under prefix {target.inspector.prefix!r} on {target.server}"
    )
    if listing.truncated:
        summary += f"; stopped after {limit} (--limit), there may be more"
    if listing.other_prefixes:
        summary += (
            "; found lock-shaped keys under prefixes: "
            f"{', '.join(map(repr, listing.other_prefixes))} (use --prefix)"
        )
    click.echo(summary, err=True)


def _print_rules(live: dict[str, LiveRule], as_json: bool) -> None:
    """The live rules of tasks and groups (limit, pause): a line each, or one JSON list."""
    now = time.time()
    if as_json:
        click.echo(json.dumps([rule_json(family, rule, now) for family, rule in live.items()]))
        return
    for family, rule in live.items():
        if rule.cap is not None:
            click.echo(f"{family}: live cap {rule.cap} (celery locks limit)")
        if rule.paused_for is not None:
            click.echo(f"{family}: {pause_line(rule.paused_for, now)}")


#: the fields of a family's live rule that a holder row of ``list --json`` carries
_RULE_FIELDS = ("live_cap", "paused", "paused_until")
#: what a holder row of ``list --json`` says of a task or group without a live rule
_NO_RULE = LiveRule(None, None)


def _print_pages(
    listing: LockStream, prefix: str, live: Optional[dict[str, LiveRule]] = None
) -> None:
    """Print ``listing``'s pages as they are read: a row per holder, or (given the ``live``
    rules by family) one JSON list (the same text as ``json.dumps`` of all rows, written a
    row at a time; nothing before the first read succeeds)."""
    as_json, first = live is not None, True
    for page in listing.pages():
        now = time.time()
        for holder, parked, (starts, _) in zip(page.holders, page.parked, page.rates):
            if live is not None:
                row = {**holder_json(holder, prefix), "parked": parked, "rate_starts": starts}
                family = str(row["name"]).rpartition(":")[0]
                shown = rule_json(family, live.get(family, _NO_RULE), now)
                row.update((field, shown[field]) for field in _RULE_FIELDS)
                click.echo(("[" if first else ", ") + json.dumps(row), nl=False)
            else:
                text = holder_row(holder, now) + (f"  parked={parked}" if parked else "")
                click.echo(text + (f"  rate_starts={starts}" if starts else ""))
            first = False
    if as_json:
        click.echo("[]" if first else "]")


NEEDS_APP = (
    "show --task needs -A: the lock name is a hash of the call's arguments bound "
    "to the task's signature (and its lock_on / lock_key), which only the app knows; or "
    "compute it in Python, app.tasks[TASKNAME].lock_options.keyer.name(args, kwargs), and "
    "give it as NAME"
)


@click.command()
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

    NAME is a lock name (TASKNAME:DIGEST, or GROUP:DIGEST for a task of a lock_group, as
    list shows it between the braces) or its full key (PREFIX:{TASKNAME:DIGEST}). Or, with
    -A, give --task and the call's --args and --kwargs as JSON: the name is computed exactly
    as the task computes it (for a task of a lock_group, the group's lock its call shares
    with the group's other tasks), e.g.

    \b
      celery -A proj locks show --task proj.tasks.rebuild \\
          --args '[42]' --kwargs '{"full": true}'

    Every slot of a lock_limit is shown (its holder, or a cooldown and what is left of it),
    then what the lock_rate window holds (starts in it, seconds until it is empty). Calls
    parked behind the lock (on_duplicate='queue') are listed after it, by task id, oldest
    first; the call waiting to replace the holder (on_duplicate='replace') is named as
    such, with its due time when a debounce holds it back. Exit status 1 when the lock is
    free; with an app, 2 when NAME is no name a task takes a lock under (TASKNAME:DIGEST) and
    nothing of it is on the server.
    """
    with _one_line_errors():
        if (name is None) == (task_name is None):
            raise LockConfigurationError("give either a lock NAME or --task TASKNAME")
        if task_name is None and (args_json is not None or kwargs_json is not None):
            raise LockConfigurationError("--args and --kwargs go with --task TASKNAME")
        if task_name is not None:
            args = _json_argument("--args", args_json or "[]", list)
            kwargs = _json_argument("--kwargs", kwargs_json or "{}", dict)
            if not settings.app_given:
                raise LockConfigurationError(NEEDS_APP)
            name = lock_name_of_call(settings.app, task_name, args, kwargs)
        assert name is not None
        target = settings.target()
        try:
            name, _ = lock_name_from_key(target, name)  # a slot's key: all its lock's slots
            holder = read_lock(target, name)
            slot_holders, starts, empty_in = read_slots(target, name)
            inspector = target.inspector
            views = inspector.per_server(name) if target.quorum else None
            parked, newest = [], None
            if isinstance(inspector, PartsReader):  # a backend where calls can be parked
                parked = asking(target, lambda: inspector.parked(name))
                newest = asking(target, lambda: inspector.waiting_newest(name)) if parked else None
            rule: Optional[LiveRule] = None
            rules = None if target.quorum else target.backend.live_rules
            if rules is not None:  # one server, Sentinel or PostgreSQL: a live cap or pause
                family = name.rpartition(":")[0]
                rule = asking(target, lambda: rules.read(family))
            markers = target.backend.markers
            queued: Optional[tuple[str, Optional[float]]] = None
            if markers is not None:
                queued_id = asking(target, lambda: markers.queued(name))
                if queued_id is not None:
                    queued = queued_id, asking(target, lambda: markers.queued_for(name))
            if settings.app_given and not slot_holders and not parked:
                # the app's locks are its tasks' (without one, --url alone, a lock may be
                # the engine's, under a name of its own); the shared fence counter says
                # nothing of one name, so it does not count as something of it
                refuse_a_name_no_task_takes(name, inspector.prefix)
        finally:
            target.close()
    click.echo(f"lock {name} under prefix {target.inspector.prefix!r} on {target.server}", err=True)
    for server, seen in views or ():  # a quorum: what each server holds
        shown = seen if isinstance(seen, Exception) else "free" if seen is None else None
        click.echo(f"  {server}: {shown or holder_row(seen, time.time())}", err=True)
    if holder is None:
        key = LockKeys.build(target.inspector.prefix, name).lock
        click.echo(f"{key}: free")
    for seen in slot_holders:  # slot 1 (the lock key) first, then a lock_limit's others
        click.echo(holder_row(seen, time.time()))
    if empty_in is not None:
        click.echo(rate_row(starts, empty_in))
    if rule is not None and rule.cap is not None:
        click.echo(f"live cap: {rule.cap} slot(s) taken at most (celery locks limit)")
    if rule is not None and rule.paused_for is not None:
        click.echo(pause_line(rule.paused_for, time.time()))
    if parked:
        click.echo(waiting_line(parked, newest, time.time()))
    if queued is not None:
        click.echo(queued_line(name, *queued, settings.invocation))
    if not slot_holders:  # free: no slot is held (nor in a cooldown)
        raise SystemExit(EXIT_FREE)


@click.command()
@click.argument("name")
@click.option(
    "--slot",
    type=click.IntRange(min=1),
    help="The slot of a lock_limit to release (1, the default, is the lock key itself); or "
    "give the slot's key as list shows it.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Release without asking the holder's worker node (the owner check still applies).",
)
@ping_timeout_option(PING_TIMEOUT, "Seconds to wait for the holder's worker node to answer a ping.")
@click.pass_obj
def release(
    settings: Settings, name: str, slot: Optional[int], force: bool, ping_timeout: float
) -> None:
    """Release a lock (or one slot of a lock_limit) whose holder is gone.

    NAME is a lock name or a key, as list shows them: PREFIX:{NAME} (slot 1) or
    PREFIX:{NAME}:slot:K (slot K of a lock_limit); or NAME with --slot K. Safe by default:
    reads the slot's holder (task id, worker node, pid), refuses while that node answers a
    ping, and deletes the key only if it still names that holder (a slot taken again in the
    meantime is left alone). --force skips the ping, never the owner check. Each slot is
    released on its own: when slot 1 is free, the slots still held are named.

    Exit status 0 released, 1 nothing released (free, or it changed hands), 2 refused or an
    error (with an app: NAME is no name a task takes a lock under, and it is free).
    """
    with _one_line_errors():
        if not force and not settings.app_given:
            raise LockConfigurationError(
                "release needs -A to ask the holder's worker node whether it is alive "
                "(through the app's broker); or give --force to release without asking"
            )
        app = settings.app

        def answers_ping(node: str) -> bool:
            return node_is_alive(app, node, ping_timeout, hint=FORCE_HINT)

        target = settings.target()
        try:
            name, in_key = lock_name_from_key(target, name)
            if in_key is not None and slot is not None and in_key != slot:
                raise LockConfigurationError(
                    f"the key given names slot {in_key}, and --slot {slot} another: give one"
                )
            outcome = release_lock(
                target,
                name,
                is_alive=None if force else answers_ping,
                slot=in_key or slot,
                hint=FORCE_HINT,
            )
            if outcome.holder is None and not outcome.held_slots and settings.app_given:
                refuse_a_name_no_task_takes(name, target.inspector.prefix)
        finally:
            target.close()
    key = outcome.key
    click.echo(f"lock {name} under prefix {target.inspector.prefix!r} on {target.server}", err=True)
    if outcome.holder is None:
        click.echo(f"{key}: free, nothing to release{held_slots(settings, name, outcome)}")
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


def held_slots(settings: Settings, name: str, outcome: Released) -> str:
    """What ``release`` adds to "free" when slot 1 is free and other slots are held."""
    slots = outcome.held_slots
    if not slots:
        return ""
    which = f"slot {slots[0]} of it is" if len(slots) == 1 else "slots "
    if len(slots) > 1:
        which += f"{', '.join(map(str, slots))} of it are"
    return (
        f"; {which} held: release each with --slot K, e.g. "
        f"{release_command(settings.invocation, name, slots[0])}"
    )


@click.command(name="clear-queued")
@click.argument("name")
@click.pass_obj
def clear_queued(settings: Settings, name: str) -> None:
    """Delete the enqueue marker of a lock (dedupe_on_enqueue).

    A call of a task with dedupe_on_enqueue leaves a marker naming its task id until a worker
    takes the lock; while it is there, the same call is not published again. A message that
    was purged or lost never reaches a worker, and its marker then blocks new calls until
    lock_queued_ttl passes. This deletes it now, if it still names the task it named when
    read. Exit status 0 cleared, 1 there was none; with an app, 2 when NAME is no name a task
    takes a lock under.
    """
    with _one_line_errors():
        target = settings.target()
        try:
            name, _ = lock_name_from_key(target, name)
            cleared = clear_queued_marker(target, name)
            if cleared is None and settings.app_given:
                refuse_a_name_no_task_takes(name, target.inspector.prefix)
        finally:
            target.close()
    click.echo(f"lock {name} under prefix {target.inspector.prefix!r} on {target.server}", err=True)
    if cleared is None:
        click.echo(f"{name}: no enqueue marker")
        raise SystemExit(EXIT_FREE)
    click.echo(f"{name}: enqueue marker of task {cleared} deleted; the next call is published")
