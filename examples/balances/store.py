"""The account store: SQLite (default) or PostgreSQL, read-modify-write like most app code.

Tables (one set per *ledger*: ``locked`` and ``plain`` runs never share rows)::

    balances(account_id PK, balance, last_fence, last_task_id)
    applied(task_id PK, account_id, cents, fence, read_task_id)

``applied`` makes an update idempotent: a redelivered task (same task id) is applied once.
``last_task_id``/``read_task_id`` record which write each update read, so the final balance can
be traced back through the chain of writes it is made of: an applied update that is not on that
chain was overwritten (a *lost update*); one on it twice would be *doubled*.

Fencing: an update of a task holding the lock with fence ``F`` first claims the account
(``last_fence := F`` if ``last_fence < F``, in the same transaction as the read), and its write
is accepted only while no newer fence has touched the account (``last_fence <= F``). A holder
whose lock expired, and that a newer holder overtook, is refused: ``StaleFenceError``.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit


class StaleFenceError(Exception):
    """A write was refused: a newer lock holder (higher fence) already touched the account."""


class StoreError(Exception):
    """The store cannot be used: a bad URL, a missing driver, an unreachable server."""


class StoreConfigurationError(StoreError):
    pass


class StoreUnavailable(StoreError):
    pass


SCHEMA = (
    "CREATE TABLE balances (account_id INTEGER PRIMARY KEY, balance BIGINT NOT NULL, "
    "last_fence BIGINT NOT NULL DEFAULT 0, last_task_id TEXT)",
    "CREATE TABLE applied (task_id TEXT PRIMARY KEY, account_id INTEGER NOT NULL, "
    "cents BIGINT NOT NULL, fence BIGINT, read_task_id TEXT)",
)


@dataclass
class Read:
    balance: int
    last_task_id: Optional[str]


class Store:
    """One ledger in one database. Methods open short transactions of their own."""

    placeholder = "?"

    def __init__(self, url: str, ledger: str) -> None:
        self.url, self.ledger = url, ledger

    @staticmethod
    def open(url: str, ledger: str) -> Store:
        scheme = urlsplit(url).scheme
        if scheme == "sqlite":
            return SqliteStore(url, ledger)
        if scheme in ("postgresql", "postgres"):
            return PostgresStore(url, ledger)
        raise StoreConfigurationError(
            f"unsupported database URL {url!r}: use sqlite:///path or postgresql://..."
        )

    def check(self) -> None:
        """Raise ``StoreError`` unless the database can be reached."""

    def sql(self, statement: str) -> str:
        return statement.replace("%s", self.placeholder)

    # -- to implement per database ----------------------------------------------------------

    def reset(self, accounts: int) -> None:
        raise NotImplementedError

    def _begin(self) -> Any:
        """A cursor inside a new write transaction."""
        raise NotImplementedError

    def _commit(self, cursor: Any) -> None:
        raise NotImplementedError

    def _rollback(self, cursor: Any) -> None:
        raise NotImplementedError

    def _query(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def drop(self) -> None:
        """Remove the ledger (its file or schema)."""
        raise NotImplementedError

    # -- the update ---------------------------------------------------------------------------

    def apply(
        self, task_id: str, account_id: int, cents: int, fence: Optional[int], work: float
    ) -> str:
        """Read the balance, "work" for ``work`` seconds, write balance + cents.

        Returns ``"applied"``, or ``"already applied"`` for a redelivered task id. Raises
        ``StaleFenceError`` when a fenced write is refused (nothing is written then).
        """
        read = self._read(task_id, account_id, fence)
        if read is None:
            return "already applied"
        time.sleep(work)  # the window in which an unlocked concurrent update gets lost
        return self._write(task_id, account_id, cents, fence, read)

    def _read(self, task_id: str, account_id: int, fence: Optional[int]) -> Optional[Read]:
        cur = self._begin()
        try:
            cur.execute(self.sql("SELECT 1 FROM applied WHERE task_id = %s"), (task_id,))
            if cur.fetchone() is not None:
                self._commit(cur)
                return None
            if fence is not None:
                cur.execute(
                    self.sql(
                        "UPDATE balances SET last_fence = %s "
                        "WHERE account_id = %s AND last_fence < %s"
                    ),
                    (fence, account_id, fence),
                )
                if cur.rowcount != 1:
                    self._stale(cur, account_id, fence)
            cur.execute(
                self.sql("SELECT balance, last_task_id FROM balances WHERE account_id = %s"),
                (account_id,),
            )
            row = cur.fetchone()
            self._commit(cur)
        except BaseException:
            self._rollback(cur)
            raise
        if row is None:
            raise StoreConfigurationError(f"no account {account_id} in ledger {self.ledger}")
        return Read(balance=int(row[0]), last_task_id=row[1])

    def _write(
        self, task_id: str, account_id: int, cents: int, fence: Optional[int], read: Read
    ) -> str:
        cur = self._begin()
        try:
            cur.execute(
                self.sql(
                    "INSERT INTO applied (task_id, account_id, cents, fence, read_task_id) "
                    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (task_id) DO NOTHING"
                ),
                (task_id, account_id, cents, fence, read.last_task_id),
            )
            if cur.rowcount != 1:  # a copy of this task got there first: apply once
                self._commit(cur)
                return "already applied"
            if fence is None:
                cur.execute(
                    self.sql(
                        "UPDATE balances SET balance = %s, last_task_id = %s WHERE account_id = %s"
                    ),
                    (read.balance + cents, task_id, account_id),
                )
            else:
                cur.execute(
                    self.sql(
                        "UPDATE balances SET balance = %s, last_task_id = %s "
                        "WHERE account_id = %s AND last_fence <= %s"
                    ),
                    (read.balance + cents, task_id, account_id, fence),
                )
                if cur.rowcount != 1:
                    self._stale(cur, account_id, fence)
            self._commit(cur)
        except BaseException:
            self._rollback(cur)
            raise
        return "applied"

    def _stale(self, cur: Any, account_id: int, fence: int) -> None:
        cur.execute(
            self.sql("SELECT last_fence FROM balances WHERE account_id = %s"), (account_id,)
        )
        row = cur.fetchone()
        raise StaleFenceError(
            f"update of account {account_id} with fence {fence} refused: the account has "
            f"already seen fence {row[0] if row else '?'} from a newer lock holder"
        )

    # -- reading the outcome ------------------------------------------------------------------

    def balances(self) -> dict[int, tuple[int, Optional[str]]]:
        rows = self._query("SELECT account_id, balance, last_task_id FROM balances")
        return {int(a): (int(b), t) for a, b, t in rows}

    def applied(self) -> dict[str, tuple[int, int, Optional[str]]]:
        """task id -> (account, cents, the task whose write it read)."""
        rows = self._query("SELECT task_id, account_id, cents, read_task_id FROM applied")
        return {t: (int(a), int(c), r) for t, a, c, r in rows}


class SqliteStore(Store):
    """``sqlite:///relative.db`` or ``sqlite:////absolute/ledger.db`` (SQLAlchemy's spelling).

    Ledger ``NAME`` lives in the file ``ledger-NAME.db`` beside the one named.
    """

    def __init__(self, url: str, ledger: str) -> None:
        super().__init__(url, ledger)
        if not url.startswith("sqlite:///") or len(url) <= len("sqlite:///"):
            raise StoreConfigurationError(f"bad SQLite URL {url!r}: use sqlite:////abs/path.db")
        base = Path(url[len("sqlite:///") :])
        self.path = base.with_name(f"{base.stem}-{ledger}{base.suffix or '.sqlite3'}")
        self._conn: Optional[sqlite3.Connection] = None

    def connection(self) -> sqlite3.Connection:
        if self._conn is None:
            # autocommit mode: transactions are the explicit BEGIN IMMEDIATE ... COMMIT below
            self._conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            self._conn.execute("PRAGMA busy_timeout = 30000")
        return self._conn

    def reset(self, accounts: int) -> None:
        self.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = self.connection()
        conn.execute("PRAGMA journal_mode = WAL")
        for statement in SCHEMA:
            conn.execute(statement)
        conn.executemany(
            "INSERT INTO balances (account_id, balance, last_fence) VALUES (?, 0, 0)",
            [(a,) for a in range(1, accounts + 1)],
        )

    def _begin(self) -> Any:
        cur = self.connection().cursor()
        cur.execute("BEGIN IMMEDIATE")  # take the write lock now: no upgrade deadlocks
        return cur

    def _commit(self, cursor: Any) -> None:
        cursor.execute("COMMIT")

    def _rollback(self, cursor: Any) -> None:
        if self.connection().in_transaction:
            cursor.execute("ROLLBACK")

    def _query(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return list(self.connection().execute(self.sql(statement), params))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def drop(self) -> None:
        self.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)


class PostgresStore(Store):
    """``postgresql://...``: ledger ``NAME`` is the schema ``csl_example_NAME``."""

    placeholder = "%s"

    def __init__(self, url: str, ledger: str) -> None:
        super().__init__(url, ledger)
        try:
            import psycopg
        except ImportError:
            raise StoreConfigurationError(
                "a postgresql:// database needs psycopg: pip install 'psycopg[binary]'"
            ) from None
        self._psycopg = psycopg
        self.schema = f"csl_example_{ledger}"
        self._conn: Any = None

    def check(self) -> None:
        try:
            self._psycopg.connect(self.url, connect_timeout=5).close()
        except self._psycopg.Error as exc:
            raise StoreUnavailable(f"cannot connect to PostgreSQL: {exc}".strip()) from None

    def connection(self) -> Any:
        if self._conn is None or self._conn.closed:
            self._conn = self._psycopg.connect(self.url, autocommit=True, connect_timeout=5)
            self._conn.execute(f"SET search_path TO {self.schema}")
        return self._conn

    def reset(self, accounts: int) -> None:
        self.close()
        with self._psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
            conn.execute(f"CREATE SCHEMA {self.schema}")
            conn.execute(f"SET search_path TO {self.schema}")
            for statement in SCHEMA:
                conn.execute(statement)
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO balances (account_id, balance, last_fence) VALUES (%s, 0, 0)",
                    [(a,) for a in range(1, accounts + 1)],
                )

    def _begin(self) -> Any:
        cur = self.connection().cursor()
        cur.execute("BEGIN")
        return cur

    def _commit(self, cursor: Any) -> None:
        cursor.execute("COMMIT")

    def _rollback(self, cursor: Any) -> None:
        if self._conn is not None and not self._conn.closed:
            status = self._conn.info.transaction_status
            if status != self._psycopg.pq.TransactionStatus.IDLE:
                cursor.execute("ROLLBACK")

    def _query(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self.connection().cursor() as cur:
            cur.execute(statement, params)
            return list(cur.fetchall())

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def drop(self) -> None:
        self.close()
        try:
            with self._psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
        except self._psycopg.Error as exc:
            print(f"could not drop schema {self.schema}: {exc}", file=sys.stderr)


_open: dict[tuple[str, str, int, int], Store] = {}


def store_for(url: str, ledger: str) -> Store:
    """This thread's store for ``ledger``: a connection per process (opened after the fork)
    and per thread (for the threads pool: a connection carries one transaction at a time)."""
    key = (url, ledger, os.getpid(), threading.get_ident())
    store = _open.get(key)
    if store is None:
        store = _open[key] = Store.open(url, ledger)
    return store
