"""Whether an app's locks live on a Redlock quorum: the URLs that name one.

A quorum is named by ``singleton_lock_url`` given as a list or tuple of 3 or more plain Redis
URLs, or as one string of them separated by commas (the form ``--url`` takes). Only that
setting names one: a broker or backend URL list is a list of failover servers, not a quorum.

What a quorum cannot do is said by its capabilities (``engine.QUORUM``); the options that need
it are refused by :mod:`.backend_support`.
"""

from __future__ import annotations

from typing import Any, Optional

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
