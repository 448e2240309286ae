"""Lock server URLs: which kind of server a URL names (one Redis, a Sentinel group, a
Redlock quorum, a PostgreSQL database), and the URL as it may be logged or shown (password
hidden).

A quorum is named by ``singleton_lock_url`` given as a list or tuple of 3 or more plain Redis
URLs, or as one string of them separated by commas (the form ``--url`` takes). Only that
setting names one: a broker or backend URL list is a list of failover servers, not a quorum.

What a quorum cannot do is said by its capabilities (``engine.QUORUM``); the options that need
it are refused by :mod:`.backend_support`.
"""

from __future__ import annotations

from typing import Any, Optional
from urllib.parse import urlsplit, urlunsplit

from celery_singleton_lock.engine import POSTGRES_SCHEMES

#: Separator of the URLs of a quorum given as one string.
SEPARATOR = ","


def quorum_urls(url: Any) -> Optional[list[str]]:
    """The server URLs of a quorum named by ``url`` (a list, tuple or comma-separated string
    of URLs); None when ``url`` names one server (or a Sentinel group)."""
    if isinstance(url, (list, tuple)):
        return [str(part).strip() for part in url]
    if isinstance(url, str) and SEPARATOR in url:
        parts = [part.strip() for part in url.split(SEPARATOR)]
        if len(parts) > 1 and all("://" in part for part in parts):
            return parts
    return None


def as_url(url: Any) -> Any:
    """``url`` with a quorum's list joined into its one-string form (others unchanged)."""
    if isinstance(url, (list, tuple)):
        return SEPARATOR.join(str(part).strip() for part in url)
    return url


def redact(url: str) -> str:
    """``url`` with its password hidden, for logs (each part of a Sentinel URL or quorum)."""
    servers = quorum_urls(url)
    if servers is not None:
        return ",".join(redact(part) for part in servers)
    if ";" in url and is_sentinel(url):
        return ";".join(redact(part) for part in url.split(";"))
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def redact_loosely(url: str) -> str:
    """``url`` with its password hidden, even when it does not parse."""
    try:
        return redact(url)
    except ValueError:
        scheme, sep, rest = url.rpartition("://")
        return f"{scheme}{sep}***@{rest.rsplit('@', 1)[1]}" if "@" in rest else url


SENTINEL_SCHEME = "sentinel"
#: Port of a ``sentinel://host`` part that names none (kombu's default too).
SENTINEL_PORT = 26379


def is_sentinel(url: str) -> bool:
    """True for Celery's Sentinel form, ``sentinel://host:port;sentinel://host:port;...``."""
    return url.lstrip().lower().startswith(f"{SENTINEL_SCHEME}://")


REDIS_SCHEMES = ("redis", "rediss", "unix")


def is_postgres(url: object) -> bool:
    """True for a PostgreSQL lock URL, ``postgresql://`` (or ``postgres://``)."""
    if not isinstance(url, str):
        return False
    scheme, sep, _ = url.strip().partition("://")
    return bool(sep) and scheme.lower() in POSTGRES_SCHEMES
