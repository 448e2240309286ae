"""What a lock command works on: the Celery app (``-A``), its lock server and prefix."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, TypeVar

import click
import redis

from celery_singleton_lock.celery.config.resolution import lock_prefix
from celery_singleton_lock.celery.config.servers import (
    DEFAULT_URL,
    check_url,
    choose_url,
    cluster_setting,
    make_client,
    transport_options,
)
from celery_singleton_lock.celery.config.urls import (
    is_postgres,
    quorum_urls,
    redact,
    redact_loosely,
)
from celery_singleton_lock.celery.worker.server_probe import probe
from celery_singleton_lock.engine import (
    Client,
    LockBackend,
    LockReader,
    QuorumLocker,
    RedisLocker,
    postgres_locker,
    validate_prefix,
)
from celery_singleton_lock.errors import LockBackendUnavailable, LockConfigurationError, LockError

T = TypeVar("T")

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


@dataclass
class Target:
    """The lock backend of the server(s) the commands below work on."""

    #: the backend made for the command: a ``RedisLocker``, or a quorum's for a Redlock quorum
    backend: LockBackend
    url: str
    #: where ``url`` came from, for the user: "--url", "-A proj:app, its broker_url"...
    source: str
    app: Any = None
    #: one client per server: a quorum's, in order, or the one server's (a Cluster's client);
    #: none for PostgreSQL (its backend reads everything, through its own connections)
    clients: list[Client] = field(default_factory=list)

    @property
    def quorum(self) -> bool:
        """True when ``url`` names a Redlock quorum (``show`` gives each server's view)."""
        return len(self.clients) > 1

    @property
    def client(self) -> Client:
        """The one server's client (a quorum's first), for what is read outside the locks."""
        return self.clients[0]

    @property
    def inspector(self) -> LockReader:
        """Reads the locks under the target's prefix (every server of a quorum)."""
        return self.backend.inspect

    @property
    def server(self) -> str:
        """The server, password hidden, and where its URL came from."""
        return f"{redact(self.url)} (from {self.source})"

    def close(self) -> None:
        self.backend.close()


def open_target(
    *,
    url: Optional[str] = None,
    app: Any = None,
    app_label: str = "-A",
    prefix: Optional[str] = None,
) -> Target:
    """The server and prefix to inspect: ``url``, else ``app``'s lock server, else the
    default; ``prefix``, else ``app``'s, else the default.

    Raises:
        LockConfigurationError: a bad URL, prefix or app setting, said in one line.
    """
    options = None
    setting = "singleton_lock_url"  # whose transport options a Sentinel URL takes
    named_in = "--url"  # where a URL that cannot work is corrected
    if url:
        source = "--url"
    elif app is not None:
        url, setting = choose_url(app.conf)
        named_in = "--url" if setting == "default" else setting
        source = (
            f"{app_label}, which names no Redis server: the default"
            if setting == "default"
            else f"{app_label}, its {setting}"
        )
    else:
        url, source = DEFAULT_URL, "default: no --url nor app"
    if app is not None:
        options = app.conf.get("singleton_lock_redis_options")
        prefix = prefix if prefix is not None else lock_prefix(app.conf)
    prefix = validate_prefix(prefix if prefix is not None else "singleton-lock")
    sentinel_options = transport_options(app.conf, setting) if app is not None else None
    check_url(url, sentinel_options)
    if is_postgres(url):
        backend = postgres_locker(url, prefix=prefix)
        return Target(backend=backend, url=url, source=source, app=app)
    servers = quorum_urls(url)
    refuse_unusable(servers or [url], options, sentinel_options, named_in)
    if servers is not None:
        clients: list[Client] = [make_client(part, options, cluster=False) for part in servers]
        quorum = QuorumLocker(clients, prefix=prefix)  # type: ignore[arg-type]  # plain clients
        return Target(backend=quorum, url=url, source=source, app=app, clients=clients)
    try:
        client = make_client(
            url,
            options,
            sentinel_options,
            cluster=cluster_setting(app.conf) if app is not None else None,
        )
    except (ValueError, TypeError) as exc:  # what redis-py raises for a URL or option it refuses
        raise LockConfigurationError(f"cannot connect to {redact_loosely(url)}: {exc}") from None
    return Target(
        backend=RedisLocker(client, prefix=prefix),
        url=url,
        source=source,
        app=app,
        clients=[client],
    )


def refuse_unusable(
    servers: list[str],
    options: Any,
    transport: Optional[Mapping[str, Any]],
    named_in: str,
) -> None:
    """Fail at once, as a starting worker does, for a server that no retry can make usable (a
    TLS mismatch, a wrong password, a host name that does not exist): the command's own
    client would wait out its timeouts and retries (15 s for ``rediss://`` to a plain server)
    and say only "Timeout connecting to server". A server that is down is left to the
    command, which says so in its own words. One ``PING`` each (see ``server_probe``).

    Raises:
        LockConfigurationError: the first such server, by its cause and what to correct.
    """
    for server in servers:
        found = probe(server, options, transport, setting=named_in)
        if found is not None and not found.heals:
            raise LockConfigurationError(found.cause)


# -- the commands' work ----------------------------------------------------------------------


def asking(target: Target, call: Callable[[], T]) -> T:
    """``call()``, with server trouble said as one ``LockError`` naming the server."""
    try:
        return call()
    except LockBackendUnavailable as exc:
        raise LockBackendUnavailable(f"{exc}; server {target.server}") from None
    except redis.exceptions.RedisError as exc:  # e.g. a server too old for SCAN TYPE
        raise LockError(f"{type(exc).__name__}: {exc}; server {target.server}") from None
