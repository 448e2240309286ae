"""``celery-singleton-lock``: inspect the locks held now (read-only).

The lock server is taken from ``--url``, else from the Celery app given with ``-A`` (the same
choice a worker makes), else ``$SINGLETON_LOCK_URL``, else ``redis://localhost:6379/0``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Optional

import click

from ..engine import LockHolder, RedisLocker, Renewer
from ..errors import LockError
from .connection import DEFAULT_URL, choose_url, make_client
from .options import lock_prefix


def _locker(url: Optional[str], app_path: Optional[str], prefix: Optional[str]) -> RedisLocker:
    options: Any = None
    if app_path:
        from celery.utils.imports import instantiate, symbol_by_name

        app = symbol_by_name(app_path)
        app = instantiate(app) if isinstance(app, type) else getattr(app, "app", app)
        url = url or choose_url(app.conf)[0]
        prefix = prefix or lock_prefix(app.conf)
        options = app.conf.get("singleton_lock_redis_options")
    url = url or os.environ.get("SINGLETON_LOCK_URL") or DEFAULT_URL
    client = make_client(url, options)
    return RedisLocker(client, prefix=prefix or "singleton-lock", renewer=Renewer(autostart=False))


def _row(holder: LockHolder, now: float) -> str:
    age = "-" if holder.acquired_at is None else f"{max(0.0, now - holder.acquired_at):.1f}s"
    ttl = "none" if holder.ttl is None else f"{holder.ttl:.1f}s"
    fence = "-" if holder.fence is None else str(holder.fence)
    return (
        f"{holder.key}  task={holder.task_id or '-'}  host={holder.host or '-'}  "
        f"pid={holder.pid or '-'}  age={age}  ttl={ttl}  fence={fence}"
    )


@click.group()
@click.option("--url", help="Redis URL of the lock server.")
@click.option("-A", "--app", "app_path", help="Celery app (module:attr) to take settings from.")
@click.option("--prefix", help="Key prefix (default: the app's, else singleton-lock).")
@click.pass_context
def main(
    ctx: click.Context, url: Optional[str], app_path: Optional[str], prefix: Optional[str]
) -> None:
    """Inspect celery-singleton-lock locks."""
    ctx.obj = lambda: _locker(url, app_path, prefix)


@main.command(name="list")
@click.option("--limit", default=1000, show_default=True, help="Stop after this many locks.")
@click.pass_context
def list_locks(ctx: click.Context, limit: int) -> None:
    """List the locks held now (SCAN, never KEYS)."""
    locker: RedisLocker = ctx.obj()
    now = time.time()
    shown = 0
    try:
        for holder in locker.scan():
            if shown >= limit:
                click.echo(f"... stopped after {limit} locks (--limit)")
                break
            click.echo(_row(holder, now))
            shown += 1
    except LockError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{shown} lock(s) held under prefix {locker.prefix!r}", err=True)


@main.command()
@click.argument("name")
@click.pass_context
def show(ctx: click.Context, name: str) -> None:
    """Show one lock by NAME (``<task>:<digest>``, or its full key)."""
    locker: RedisLocker = ctx.obj()
    if name.startswith(f"{locker.prefix}:{{") and name.endswith("}"):
        name = name[len(locker.prefix) + 2 : -1]
    try:
        holder = locker.read(name)
        fence = locker.fence(name)
    except LockError as exc:
        raise click.ClickException(str(exc)) from exc
    if holder is None:
        click.echo(f"{locker.keys(name).lock}: free (last fence {fence})")
        sys.exit(1)
    click.echo(_row(holder, time.time()))
