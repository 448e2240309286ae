"""``celery [-A proj] locks ...``: the one lock command, a group added to Celery's own.

Celery finds it through the ``celery.commands`` entry point (pyproject.toml), which the
``celery`` command loads in EVERY ``celery`` process: ``celery worker`` of an app that takes no
locks included. So the group lives here, outside the Celery layer (whose package import
connects signal receivers), and its sub-commands (:mod:`celery_singleton_lock.celery.cli`) are
imported only when ``celery locks ...`` itself runs. Nothing of the Celery layer imports this
module.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shlex
import sys
from typing import Any, Iterator, Optional

import click

#: ``celery locks`` sub-command name -> (module, attribute), imported on first use.
SUBCOMMANDS = {
    "list": ("celery_singleton_lock.celery.cli.commands", "list_command"),
    "show": ("celery_singleton_lock.celery.cli.commands", "show"),
    "release": ("celery_singleton_lock.celery.cli.commands", "release"),
    "clear-queued": ("celery_singleton_lock.celery.cli.commands", "clear_queued"),
    "limit": ("celery_singleton_lock.celery.cli.live_rule_commands", "limit"),
    "pause": ("celery_singleton_lock.celery.cli.live_rule_commands", "pause"),
    "resume": ("celery_singleton_lock.celery.cli.live_rule_commands", "resume"),
    "doctor": ("celery_singleton_lock.celery.cli.doctor", "doctor"),
    "serve": ("celery_singleton_lock.celery.cli.console", "serve"),
}

_NO_ARGS_IS_HELP: tuple[type[BaseException], ...] = tuple(
    getattr(click.exceptions, name)
    for name in ("NoArgsIsHelpError",)
    if hasattr(click.exceptions, name)
)


@contextlib.contextmanager
def usage_in_one_line() -> Iterator[None]:
    """A usage error (unknown option, bad --limit...) said in one line, like every other error:
    click would print the usage and a hint first."""
    try:
        yield
    except click.UsageError as exc:
        # no arguments at all: click (8.2+) shows the help, through a UsageError
        if exc.ctx is None or isinstance(exc, _NO_ARGS_IS_HELP):
            raise
        raise click.UsageError(
            f"{exc.format_message()} (see {exc.ctx.command_path} --help)"
        ) from None


class OneLineGroup(click.Group):
    """A click group whose usage errors are one line (:func:`usage_in_one_line`)."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with usage_in_one_line():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        with usage_in_one_line():
            return super().invoke(ctx)


class LazyGroup(OneLineGroup):
    """A group whose sub-commands (:data:`SUBCOMMANDS`) are imported when one is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> Optional[click.Command]:
        where = SUBCOMMANDS.get(cmd_name)
        if where is None:
            return None
        module, attribute = where
        command: click.Command = getattr(importlib.import_module(module), attribute)
        return command


def app_argument(argv: list[str]) -> Optional[str]:
    """The value of celery's ``-A`` / ``--app`` option in ``argv``, as typed (None if absent)."""
    for index, word in enumerate(argv):
        if word in ("-A", "--app") and index + 1 < len(argv):
            return argv[index + 1]
        if word.startswith("--app="):
            return word[len("--app=") :]
        if word.startswith("-A") and len(word) > 2:
            return word[2:]
        if word == "locks":  # the sub-command: celery's own options end here
            return None
    return None


def app_label(app: Any, given: bool) -> str:
    """How the app Celery loaded is named in messages (``Target.source``); without ``-A``,
    Celery's default app (whose ``main`` may say "default", or nothing)."""
    if given and getattr(app, "main", None):
        return f"app {app.main!r}"
    return "the app -A names" if given else "Celery's default app (no -A)"


@click.group(name="locks", cls=LazyGroup)
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
    singleton_lock_url, else its Redis broker, else its Redis result backend), or --url.
    Without -A (no app module at hand), give --url: the commands then take any lock name,
    and release needs --force. Every command names the server it queried on stderr.

    Exit status: 0 done, 1 nothing to do (the lock is free), 2 an error or a refused release.
    """
    # ``**_preload``: Celery adds the app's preload options to every sub-command
    from celery_singleton_lock.celery.cli.commands import Settings  # a locks command runs

    app = ctx.obj.app
    given = ctx.find_root().params.get("app")  # celery's -A (or $CELERY_APP) as typed
    if not isinstance(given, str):  # Celery < 5.5 keeps the loaded app there, not the text
        given = app_argument(sys.argv[1:]) or os.environ.get("CELERY_APP")
    program = f"celery -A {shlex.quote(given)} locks" if isinstance(given, str) else "celery locks"
    ctx.obj = Settings(
        app=app,
        app_given=isinstance(given, str),
        url=url,
        prefix=prefix,
        app_label=app_label(app, isinstance(given, str)),
        program=program,
    )
