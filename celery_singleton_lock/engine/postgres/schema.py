"""The tables, sequence and channel of the PostgreSQL backend in one schema, and the SQL that
creates them on first use.

In schema ``S`` (``public`` unless the URL says ``?schema=S``)::

    S.singleton_lock_leases    one row per lock name ever taken under a prefix:
                               (prefix, name) the key; token, pid, host, task_id its holder;
                               acquired_at and lease_until by the server's clock (now());
                               fence the holder's fencing token. A free lock keeps its row
                               (token '', lease_until '-infinity'): see locker.py for why
    S.singleton_lock_fence     the sequence the fences come from: strictly increasing,
                               never reused (a sequence survives a restart)
    S.singleton_lock_finished  finish records (prefix, name, task_id) until a time: the
                               release of an acks_late task remembers it ran to the end
    singleton_lock_released_S  the NOTIFY channel a release is announced on (payload: the lock
                               key), in the releasing statement's own transaction

The tables and functions of the parked calls (policies ``queue``, ``replace``, ``restart``)
are :mod:`.parking_ddl`'s.

Created with ``CREATE ... IF NOT EXISTS`` under a transaction-scoped advisory lock (which,
unlike a session one, works through PgBouncer's transaction pooling), so processes starting
together do not race on the catalog.
"""

from __future__ import annotations

import re
import zlib

from celery_singleton_lock.engine.postgres import parking_ddl
from celery_singleton_lock.errors import LockConfigurationError

_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,39}$")


class Schema:
    """The names of the backend's objects in one PostgreSQL schema, and their DDL."""

    def __init__(self, name: str = "public") -> None:
        if not _SCHEMA_NAME.match(name):
            raise LockConfigurationError(
                f"PostgreSQL schema {name!r} for the locks is invalid: use 1-40 lower-case "
                "letters, digits and _ (not starting with a digit)"
            )
        self.name = name
        self.leases = f"{name}.singleton_lock_leases"
        self.fence = f"{name}.singleton_lock_fence"
        self.finished = f"{name}.singleton_lock_finished"
        #: the NOTIFY channel of releases (one per schema; the payload names the lock)
        self.channel = f"singleton_lock_released_{name}"

    @property
    def advisory_key(self) -> int:
        """The transaction advisory lock the DDL runs under (a stable 32-bit number)."""
        return zlib.crc32(f"celery-singleton-lock:{self.name}".encode())

    def ddl(self) -> list[str]:
        """The statements that create what is missing (each ``IF NOT EXISTS``)."""
        schema = f"CREATE SCHEMA IF NOT EXISTS {self.name}"
        return [
            *([] if self.name == "public" else [schema]),
            f"""CREATE TABLE IF NOT EXISTS {self.leases} (
                prefix text NOT NULL,
                name text NOT NULL,
                token text NOT NULL,
                pid integer,
                host text NOT NULL DEFAULT '',
                task_id text NOT NULL DEFAULT '',
                acquired_at timestamptz,
                lease_until timestamptz NOT NULL,
                fence bigint,
                PRIMARY KEY (prefix, name)
            )""",
            f"CREATE SEQUENCE IF NOT EXISTS {self.fence}",
            f"""CREATE TABLE IF NOT EXISTS {self.finished} (
                prefix text NOT NULL,
                name text NOT NULL,
                task_id text NOT NULL,
                until timestamptz NOT NULL,
                PRIMARY KEY (prefix, name, task_id)
            )""",
            # -- the queue parts (parked calls, latest wins, cancel flags): parking_ddl.py
            *parking_ddl.ddl(self.name),
        ]
