"""The tables, sequences, functions and channel of the PostgreSQL backend in one schema, and the
SQL that creates them on first use.

In schema ``S`` (``public`` unless the URL says ``?schema=S``): the tables and sequences of
``sql/tables.sql`` (each described there), the PL/pgSQL functions of the other ``sql/*.sql``
files (each headed by its contract, as the Lua scripts are), and ``singleton_lock_released_S``,
the NOTIFY channel a release is announced on (payload: the lock key), in the releasing
statement's own transaction. The files name the schema ``__schema__``.

The functions make an operation with branches (a slot taken, a park, a hand-off, a
displacement) ONE statement: one round trip, one transaction, as a Lua script is on Redis.

**Functions are versioned, never replaced.** A function's name ends in its version
(``singleton_lock_park_v1``) and is created only if no function of that name exists; a change
to its text is a new file version under a new name (``_v2``), which the calls of the new
release name. So two releases share a schema during a rolling deploy, each calling its own
function (``CREATE OR REPLACE`` would switch the old release's processes to a text they were not
written for), and a role that does not own the functions can start once they exist (only the
owner may replace a function). ``tests/unit/test_postgres_sql.py`` pins each function's text to
its name.

Created with ``CREATE ... IF NOT EXISTS`` under a transaction-scoped advisory lock (which,
unlike a session one, works through PgBouncer's transaction pooling), so processes starting
together do not race on the catalog.
"""

from __future__ import annotations

import functools
import re
import zlib
from importlib import resources

from celery_singleton_lock.errors import LockConfigurationError

_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,39}$")
#: the name a function file creates (its one ``CREATE FUNCTION``)
_CREATES = re.compile(r"^CREATE FUNCTION __schema__\.(\w+)\(", re.MULTILINE)

#: the function files, in the order they are created (a function after those it calls)
FUNCTION_FILES = ("row", "take", "reserve", "turn", "take_slot", "park", "hand_on", "latest")


@functools.cache
def sql_file(name: str) -> str:
    """The text of ``sql/<name>.sql``."""
    file = resources.files("celery_singleton_lock.engine.postgres") / "sql" / f"{name}.sql"
    return file.read_text(encoding="utf-8")


@functools.cache
def function_name(file: str) -> str:
    """The versioned name (``singleton_lock_park_v1``) of the function ``sql/<file>.sql``
    creates."""
    match = _CREATES.search(sql_file(file))
    if match is None:  # a file of this package: caught by its unit tests, never by a user
        raise LockConfigurationError(f"sql/{file}.sql of the package creates no function")
    return match.group(1)


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
        # -- admission (lock_limit, lock_rate, lock_cooldown, dedupe_on_enqueue): slots.py,
        # markers.py
        self.starts = f"{name}.singleton_lock_starts"
        self.queued = f"{name}.singleton_lock_queued"
        self.caps = f"{name}.singleton_lock_caps"
        #: the functions, by file (``take_slot``: ``S.singleton_lock_take_slot_v1``)
        self.functions = {file: f"{name}.{function_name(file)}" for file in FUNCTION_FILES}
        self.take_slot = self.functions["take_slot"]
        #: the NOTIFY channel of releases (one per schema; the payload names the lock)
        self.channel = f"singleton_lock_released_{name}"

    @property
    def advisory_key(self) -> int:
        """The transaction advisory lock the DDL runs under (a stable 32-bit number)."""
        return zlib.crc32(f"celery-singleton-lock:{self.name}".encode())

    def ddl(self) -> list[str]:
        """The statements that create what is missing: the tables ``IF NOT EXISTS``, each
        function only if no function of its versioned name exists (see the module)."""
        schema = f"CREATE SCHEMA IF NOT EXISTS {self.name}"
        return [
            *([] if self.name == "public" else [schema]),
            self._text("tables"),
            *(self._function(file) for file in FUNCTION_FILES),
        ]

    def _text(self, file: str) -> str:
        return sql_file(file).replace("__schema__", self.name)

    def _function(self, file: str) -> str:
        # to_regproc: NULL when absent (a versioned name is never overloaded)
        return f"""DO $do$ BEGIN
IF to_regproc('{self.functions[file]}') IS NULL THEN
EXECUTE $create${self._text(file)}$create$;
END IF;
END $do$"""
