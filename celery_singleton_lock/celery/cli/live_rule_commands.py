"""``celery locks limit / pause / resume``: change the live rule of a task's (or lock_group's)
locks while workers run: a cap on the slots taken at once, and a pause of every start. Stored on
the lock server in one key per task or group (engine ``LiveRules``; on a Redis Cluster a copy
of it in every hash slot, all written before the command returns), read by every worker's next
acquire in the same script call: no restart, no round trip more.

Needs one Redis server, a Sentinel group or a Redis Cluster (PostgreSQL: the cap only, kept in
its caps table; ``pause`` and ``resume`` are refused there, naming the backend); a Redlock quorum
keeps no such key (each master's would be a rule of its own), and refuses the commands with that
said.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import click

from celery_singleton_lock.celery.cli.app_target import Target
from celery_singleton_lock.celery.cli.commands import Settings, _one_line_errors
from celery_singleton_lock.engine import LiveRule, LiveRules, PausingRules
from celery_singleton_lock.errors import LockConfigurationError

NOT_HERE = (
    "the live rule (a cap or a pause) is read by the acquire scripts from one key per task or "
    "group: it needs one Redis server, Sentinel or a Redis Cluster, not a Redlock quorum (each "
    "master would keep a rule of its own; PostgreSQL keeps the cap, not the pause)"
)


def live_rules_of(target: Target) -> LiveRules:
    """The target's live rules, or a clear error where it keeps none."""
    rules: Optional[LiveRules] = None if target.quorum else target.backend.live_rules
    if rules is None:
        raise LockConfigurationError(NOT_HERE)
    return rules


def pausing_rules_of(target: Target) -> PausingRules:
    """The target's live rules that can pause, or a clear error naming its backend."""
    rules = live_rules_of(target)
    if not isinstance(rules, PausingRules):
        raise LockConfigurationError(
            f"a pause is read by the Redis acquire scripts: {target.backend.capabilities.kind} "
            "keeps live caps (celery locks limit) but no pause; use one Redis server, Sentinel "
            "or a Redis Cluster for pausing"
        )
    return rules


def _family_options(settings: Settings, family: str) -> Optional[Any]:
    """The lock options of a task of the app whose task or group name is ``family`` (None
    without an app, which cannot be checked then).

    Raises:
        LockConfigurationError: with an app, no locked task has that name or group.
    """
    if not settings.app_given:
        return None
    for task in list(settings.app.tasks.values()):
        options: Any = getattr(task, "lock_options", None)
        keyer = getattr(options, "keyer", None)
        if keyer is not None and f"{keyer.namespace}{keyer.head}" == family:
            return options
    raise LockConfigurationError(
        f"no locked task has the name or lock_group {family!r}: give a task's or a group's name"
    )


def rule_line(name: str, rule: LiveRule) -> str:
    """How a family's pause reads in ``limit``, ``pause``, ``resume`` and ``show``."""
    if rule.paused_for is None:
        return f"{name}: not paused"
    if math.isinf(rule.paused_for):
        return f"{name}: paused until resumed (celery locks resume {name})"
    return f"{name}: paused for {rule.paused_for:.1f}s more"


@click.command(name="limit")
@click.argument("name")
@click.argument("cap", required=False, type=click.IntRange(min=1))
@click.option("--reset", is_flag=True, help="Remove the live cap: the declared limit holds.")
@click.pass_obj
def limit(settings: Settings, name: str, cap: Optional[int], reset: bool) -> None:
    """Set, show or remove the live cap of a task's (or lock_group's) locks.

    NAME is the task's name, or its lock_group. With CAP, at most CAP slots of each of its
    locks are taken at once, from every worker's next acquire on, without a restart: a
    lowered cap lets the bodies running finish, and starts none until fewer than CAP run
    (parked calls stay parked). It only lowers a declared lock_limit (above 1, or callable);
    a cap above it changes nothing. --reset removes it; neither: show it. Needs one Redis
    server, Sentinel, a Redis Cluster or PostgreSQL.
    """
    with _one_line_errors():
        if cap is not None and reset:
            raise LockConfigurationError("give CAP or --reset, not both")
        target = settings.target()
        try:
            rules = live_rules_of(target)
            options = _family_options(settings, name)
            declared = None if options is None else options.limit
            if type(declared) is int and declared <= 1:
                raise LockConfigurationError(
                    f"{name!r} declares lock_limit={declared}: a live cap lowers a lock_limit "
                    "above 1 (or callable); to stop its starts, use celery locks pause"
                )
            if reset or cap is not None:
                rules.set_cap(name, cap)
            now = rules.read(name).cap
        finally:
            target.close()
    shown = "none" if now is None else str(now)
    limit_text = "" if declared is None else f" (declared lock_limit: {declared})"
    click.echo(f"live cap of {name}: {shown}{limit_text}")


@click.command(name="pause")
@click.argument("name")
@click.option(
    "--for",
    "seconds",
    type=click.FloatRange(min=0, min_open=True),
    help="End the pause by itself after SECONDS (server clock); else until `locks resume`.",
)
@click.pass_obj
def pause(settings: Settings, name: str, seconds: Optional[float]) -> None:
    """Pause every start of a task's (or lock_group's) locks.

    NAME is the task's name, or its lock_group. From every worker's next acquire on, no body of
    it starts: each call follows its on_duplicate policy as when the lock is held (queue: it
    stays parked, holding no worker slot, and is handed its slot when the pause ends; skip:
    skipped with reason "paused"; retry: sent again after the pause's end; replace, restart:
    the newest call waits, holding no worker slot, and runs when the pause ends; wait, fail,
    join as with a held lock). Bodies running go on. Replaces any pause set before (shorter or
    longer). Needs one Redis server, Sentinel or a Redis Cluster.
    """
    with _one_line_errors():
        target = settings.target()
        try:
            rules = pausing_rules_of(target)
            _family_options(settings, name)
            rules.pause(name, seconds)
            now = rules.read(name)
        finally:
            target.close()
    click.echo(rule_line(name, now))


@click.command(name="resume")
@click.argument("name")
@click.pass_obj
def resume(settings: Settings, name: str) -> None:
    """End the pause of a task's (or lock_group's) locks now: its parked calls are handed
    their slots at once, and the next calls start. Needs one Redis server, Sentinel or a Redis
    Cluster."""
    with _one_line_errors():
        target = settings.target()
        try:
            rules = pausing_rules_of(target)
            _family_options(settings, name)
            rules.resume(name)
            now = rules.read(name)
        finally:
            target.close()
    click.echo(rule_line(name, now))
