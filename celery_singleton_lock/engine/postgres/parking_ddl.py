"""The tables and functions of the queue parts on PostgreSQL (policies ``queue``, ``replace``,
``restart``), read from ``sql/*.sql``: each file starts with its contract, as the Lua scripts
do, and names the lock schema ``__schema__``.

The functions are PL/pgSQL so that a park, a hand-off or a displacement is ONE statement (one
round trip, one transaction) with its branches on the server, as a Lua script is on Redis.
Each first locks the lock's lease row (``singleton_lock_row``), so the operations on one lock's
parked calls run one at a time. Created (``CREATE OR REPLACE``) with the rest of the schema
(:meth:`.schema.Schema.ddl`): on first use, and by the worker's start probe.
"""

from __future__ import annotations

import functools
from importlib import resources

#: the files, in the order they are run (a function after what it reads)
FILES = ("tables", "lock_row", "park", "hand_on", "latest")


@functools.cache
def _read(name: str) -> str:
    file = resources.files("celery_singleton_lock.engine.postgres") / "sql" / f"{name}.sql"
    return file.read_text(encoding="utf-8")


def ddl(schema: str) -> list[str]:
    """The statements that create the queue parts' tables and functions in ``schema`` (a
    name :class:`~.schema.Schema` validated)."""
    return [_read(name).replace("__schema__", schema) for name in FILES]
