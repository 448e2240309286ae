"""Can this worker use its lock server? Asked once as it starts, before it says "ready".

One ``PING`` per server (each server of a Redlock quorum), with short timeouts and no retry.
What it finds is said first, by its real cause, naming the server:

* wrong credentials (``AuthenticationError``) or a TLS mismatch (``rediss://`` to a port that
  speaks plain Redis, ``redis://`` to a TLS-only port, a certificate that does not verify):
  the configuration is wrong and no retry will heal it, so the worker is not started
  (:class:`~celery_singleton_lock.errors.LockConfigurationError`, exit 78 like the other
  configuration errors);
* a host name that does not resolve (the resolver answers that no such name exists, as for a
  misspelt host): a configuration error like those above, the worker is not started; a
  resolver that cannot answer for now (``EAI_AGAIN``: DNS not up yet) is an outage, below;
* refused, timed out, a resolver not answering: the server may be down for now; the worker
  starts, with one WARNING naming the server and what the locked tasks do until it answers
  (``lock_on_backend_error``).

When a registered task needs a newer Redis than some (``on_duplicate='replace'``: Redis 6.2), the
server's ``redis_version`` is read too (:func:`redis_version`): a server too old for the task's
scripts refuses the start, naming the task, the option and the version
(:func:`.start_checks.check_lock_servers`).

A TLS handshake to a plain server may hang (the server waits for a line that never ends) or
fail with an SSL error; either way the URL is then tried once the other way (plain for
``rediss://``, TLS without verification for ``redis://``): a server that answers that way
is a mismatch, not an outage.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from typing import Any, Mapping, Optional
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_singleton_lock.celery.config.servers import close_client, make_client
from celery_singleton_lock.celery.config.urls import is_sentinel, redact
from celery_singleton_lock.engine import postgres_locker
from celery_singleton_lock.errors import LockBackendUnavailable

#: Seconds a probe waits to connect, and for each reply.
PROBE_TIMEOUT = 2.0

#: ``getaddrinfo`` errors that say the name does not exist (not that the resolver could not
#: answer now, ``EAI_AGAIN``): a misspelt host, not an outage. ``EAI_NODATA`` is glibc's.
NO_SUCH_NAME = frozenset(
    code
    for code in (getattr(socket, "EAI_NONAME", None), getattr(socket, "EAI_NODATA", None))
    if code is not None
)

#: Lock servers this process found unusable as the worker started, and reported: nothing
#: else at start asks them again (each question would wait out its own timeouts).
unusable_at_start: set[str] = set()


@dataclass(frozen=True)
class Unusable:
    """Why the worker cannot use a lock server now."""

    #: the cause, said for a person (server, error)
    cause: str
    #: retrying may help (the server is down or unreachable); False: the configuration is wrong
    heals: bool


def where(url: str) -> str:
    """``host:port`` (the socket path for ``unix://``; the redacted URL for Sentinel)."""
    if is_sentinel(url):
        return redact(url)
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    return f"{parts.hostname or 'localhost'}:{parts.port or 6379}"


def probe(
    url: str,
    options: Optional[Mapping[str, Any]] = None,
    transport: Optional[Mapping[str, Any]] = None,
    *,
    setting: str = "singleton_lock_url",
) -> Optional[Unusable]:
    """None if the server at ``url`` answers ``PING`` (any reply but an authentication error
    counts: a server that refuses ``PING`` to an ACL user still holds locks); else why not.
    ``setting``: where the URL came from, named in what to fix."""
    error = _ping(url, options, transport)
    if error is None:
        return None
    server = f"lock server {where(url)}"
    described = f"{type(error).__name__}: {error}"
    if isinstance(error, redis.AuthenticationError):
        return Unusable(
            f"{server}: authentication failed ({described}); a wrong or missing password "
            f"does not heal by retrying: correct the user and password in {setting} (or the "
            "server's ACL)",
            heals=False,
        )
    cause = _causes(error)
    if isinstance(cause, socket.gaierror) and cause.errno in NO_SUCH_NAME:
        return Unusable(
            f"{server}: the host name does not resolve ({described}); a name that does not "
            f"exist does not heal by retrying: correct the host in {setting} (a typo?)",
            heals=False,
        )
    if isinstance(cause, ssl.SSLCertVerificationError):
        return Unusable(
            f"{server}: TLS certificate not verified ({described}); give the CA that signed "
            f"it (ssl_ca_certs) in {setting} or in singleton_lock_redis_options",
            heals=False,
        )
    mismatch = None if is_sentinel(url) else _tls_mismatch(url, options, error)
    if mismatch is not None:
        return Unusable(
            f"{server} {mismatch} ({described}); correct the scheme in {setting}", False
        )
    if isinstance(cause, ConnectionRefusedError):
        what = "refused the connection (not running, or another port?)"
    elif isinstance(error, redis.TimeoutError):
        what = f"did not answer within {PROBE_TIMEOUT:g}s"
    else:
        what = "is not reachable"
    return Unusable(f"{server} {what} ({described})", heals=True)


def probe_postgres(url: str, prefix: str) -> Optional[Unusable]:
    """None if the PostgreSQL database at ``url`` answers and holds the lock tables (made now
    when missing, see docs/how-to/postgres-locks.md); else why not. A refused login or a
    refused ``CREATE`` does not heal by retrying; an outage may."""
    locker = postgres_locker(url, prefix=prefix)
    try:
        error = locker.probe()
    finally:
        locker.close()
    if error is None:
        return None
    text = str(error)
    heals = isinstance(error, LockBackendUnavailable) and "authentication failed" not in text
    return Unusable(f"PostgreSQL lock server: {text}", heals=heals)


def _client(
    url: str, options: Optional[Mapping[str, Any]], transport: Optional[Mapping[str, Any]]
) -> Any:
    """A client of the probe's short timeouts and no retry; a node of a Redis Cluster answers
    as a single server does."""
    settings = {
        **(options or {}),
        "socket_timeout": PROBE_TIMEOUT,
        "socket_connect_timeout": PROBE_TIMEOUT,
        "retry": Retry(NoBackoff(), 0),
    }
    return make_client(url, settings, transport, cluster=False)


def redis_version(
    url: str,
    options: Optional[Mapping[str, Any]] = None,
    transport: Optional[Mapping[str, Any]] = None,
) -> Optional[tuple[int, ...]]:
    """The ``redis_version`` of the server at ``url`` (``INFO server``), as numbers; None when
    it cannot be read (``INFO`` refused to an ACL user, a reply without it): nothing is
    refused for a version not known."""
    try:
        client = _client(url, options, transport)
    except redis.RedisError:
        return None
    try:
        found = client.info("server").get("redis_version")
    except redis.RedisError:
        return None
    finally:
        close_client(client)
    return parse_version(found)


def parse_version(text: Any) -> Optional[tuple[int, ...]]:
    """``"6.0.16"`` -> ``(6, 0, 16)``; None for what is not dotted numbers."""
    try:
        return tuple(int(part) for part in str(text).split("."))
    except ValueError:
        return None


def _ping(
    url: str, options: Optional[Mapping[str, Any]], transport: Optional[Mapping[str, Any]]
) -> Optional[redis.RedisError]:
    try:
        client = _client(url, options, transport)
    except redis.RedisError as exc:
        return exc
    try:
        client.ping()
    except redis.AuthenticationError as exc:
        return exc
    except redis.ResponseError:
        return None  # it answered
    except redis.RedisError as exc:
        return exc
    finally:
        close_client(client)
    return None


def _causes(error: BaseException) -> Optional[BaseException]:
    """The OS or SSL error redis-py's error was raised from, if any."""
    return error.__cause__ or error.__context__


def _tls_mismatch(
    url: str, options: Optional[Mapping[str, Any]], error: redis.RedisError
) -> Optional[str]:
    """What is wrong if ``url`` failed for speaking (or not speaking) TLS, else None."""
    parts = urlsplit(url)
    tls = parts.scheme == "rediss" or bool((options or {}).get("ssl"))
    if parts.scheme == "unix" or isinstance(_causes(error), ConnectionRefusedError):
        return None
    if tls:
        plain = {key: value for key, value in (options or {}).items() if "ssl" not in key}
        if _answers(urlunsplit(parts._replace(scheme="redis")), plain):
            return "speaks plain Redis, not TLS: rediss:// cannot reach it"
        return None
    unverified = {**(options or {}), "ssl_cert_reqs": "none"}
    if _answers(urlunsplit(parts._replace(scheme="rediss")), unverified):
        return "speaks TLS only: redis:// cannot reach it (use rediss://)"
    return None


def _answers(url: str, options: Mapping[str, Any]) -> bool:
    error = _ping(url, options, None)
    return error is None or isinstance(error, redis.AuthenticationError)
