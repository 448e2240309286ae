"""``celery -A proj locks ...``: the lock commands as a ``celery`` sub-command.

Registered in Celery's ``celery.commands`` entry point group (pyproject.toml), which the
``celery`` command loads through click-plugins. Celery has then loaded the app (``-A``,
``-b``, ``--config``...) and hands it over as ``ctx.obj.app``; this group only swaps in the
:class:`~.commands.Settings` the commands of :mod:`.commands` read, so ``list``, ``show``
and ``release`` are the very command objects of the standalone ``celery-singleton-lock`` command.
"""

from __future__ import annotations

from typing import Any, Optional

import click

from celery_singleton_lock.celery.cli.commands import (
    Settings,
    _OneLineGroup,
    clear_queued,
    list_command,
    release,
    show,
)
from celery_singleton_lock.celery.cli.console import serve
from celery_singleton_lock.celery.cli.doctor import doctor


def app_label(app: Any) -> str:
    """How the app Celery loaded is named in messages (``Target.source``)."""
    return f"app {app.main!r}" if getattr(app, "main", None) else "Celery's default app (no -A)"


@click.group(name="locks", cls=_OneLineGroup)
@click.option(
    "--url",
    metavar="URL",
    help="Redis URL of the lock server, instead of the one the app's workers use.",
)
@click.option("--prefix", help="Key prefix of the locks (default: the app's).")
@click.pass_context
def locks(
    ctx: click.Context, /, url: Optional[str], prefix: Optional[str], **_preload: Any
) -> None:
    """List and show celery-singleton-lock locks, release an abandoned one.

    The lock server and key prefix are the ones the app's workers use (its
    singleton_lock_url, else its Redis broker, else its Redis result backend). Every command
    names the server it queried on stderr.

    Exit status: 0 done, 1 nothing to do (the lock is free), 2 an error or a refused release.
    """
    # ``**_preload``: Celery adds the app's preload options to every sub-command
    app = ctx.obj.app
    ctx.obj = Settings(url=url, app_path=None, prefix=prefix, app=app, app_label=app_label(app))


locks.add_command(list_command)
locks.add_command(show)
locks.add_command(release)
locks.add_command(clear_queued)
locks.add_command(doctor)
locks.add_command(serve)
