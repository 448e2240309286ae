"""The PostgreSQL backend: leases in table rows (:mod:`.locker`), for stacks with no Redis.

Its capabilities (:data:`POSTGRES`) need no driver; the backend itself needs psycopg 3 (the
extra ``[postgres]``), imported when one is made (:func:`postgres_locker`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery_singleton_lock.engine.postgres.capabilities import POSTGRES
from celery_singleton_lock.errors import LockConfigurationError

if TYPE_CHECKING:
    from celery_singleton_lock.engine.postgres.locker import PostgresLocker

#: URL schemes of a PostgreSQL lock server
SCHEMES = ("postgresql", "postgres")


def postgres_locker(url: str, **options: Any) -> PostgresLocker:
    """A :class:`~.locker.PostgresLocker` of ``url`` (``options``: its keyword arguments).

    Raises:
        LockConfigurationError: psycopg 3 is not installed.
    """
    try:
        from celery_singleton_lock.engine.postgres.locker import PostgresLocker
    except ImportError as exc:
        raise LockConfigurationError(
            f"a postgresql:// lock URL needs psycopg 3 ({exc}): "
            "pip install 'celery-singleton-lock[postgres]'"
        ) from None
    return PostgresLocker(url, **options)


__all__ = ["POSTGRES", "SCHEMES", "postgres_locker"]
