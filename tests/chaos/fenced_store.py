"""A small fenced, idempotent account store in Redis, for the chaos suite.

It lives on a Redis server of its own (never the lock server), reached by the workers through
``CSL_STORE_URL``, and follows the claim-at-read / write-if-no-newer-claim pattern of
``examples/balances/store.py``, as two Lua scripts:

* ``CLAIM`` (the read): an update holding fence ``F`` raises the account's ``last_fence`` to
  ``F`` (refused if a newer fence already claimed it) and reads the balance and the task whose
  write it is.
* ``WRITE``: applied only if the task id was never applied (``SADD applied``) and no newer fence
  has claimed the account since (``last_fence <= F``); sets ``balance = read + cents``.

The write is a read-modify-write on purpose: two holders interleaving would lose an update,
which the analysis below would see. Every applied update records the task whose write it read,
so the final balance can be traced back through the chain of writes it is made of: an applied
update that is not on that chain was overwritten (lost); one on it twice was doubled.

Keys, all under a namespace ``ns`` (one per scenario)::

    <ns>:acct:<account>   hash: balance, last_fence, last_task
    <ns>:applied          set of applied task ids
    <ns>:info             hash: task id -> "account|cents|fence|read_task"
    <ns>:runs             list: one "account|task_id|pid|time|fence|node" per body start
    <ns>:stale            counter: writes (or claims) refused by the fence
    <ns>:already          counter: bodies that found their task id already applied
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

import redis

#: Where the lock_lost receiver in tests/celery/tasks/chaos.py records: "task_id|key|time".
LOCK_LOST_LIST = "chaos:lock_lost"

CLAIM = """
-- KEYS[1] account hash, KEYS[2] applied set
-- ARGV[1] task id, ARGV[2] fence
-- Returns {'already'} | {'stale', last_fence} | {'ok', balance, last_task}
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then
  return {'already'}
end
local last = tonumber(redis.call('HGET', KEYS[1], 'last_fence') or '0')
local fence = tonumber(ARGV[2])
if last > fence then
  return {'stale', tostring(last)}
end
if fence > last then
  redis.call('HSET', KEYS[1], 'last_fence', ARGV[2])
end
return {'ok', redis.call('HGET', KEYS[1], 'balance') or '0',
        redis.call('HGET', KEYS[1], 'last_task') or ''}
"""

WRITE = """
-- KEYS[1] account hash, KEYS[2] applied set, KEYS[3] info hash
-- ARGV[1] task id, ARGV[2] fence, ARGV[3] new balance, ARGV[4] task whose write was read,
-- ARGV[5] account, ARGV[6] cents
-- Returns {'already'} | {'stale', last_fence} | {'applied'}
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then
  return {'already'}
end
local last = tonumber(redis.call('HGET', KEYS[1], 'last_fence') or '0')
if last > tonumber(ARGV[2]) then
  return {'stale', tostring(last)}
end
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1],
           ARGV[5] .. '|' .. ARGV[6] .. '|' .. ARGV[2] .. '|' .. ARGV[4])
redis.call('HSET', KEYS[1], 'balance', ARGV[3], 'last_task', ARGV[1])
return {'applied'}
"""


class StaleFence(Exception):
    """A claim or write was refused: a newer lock holder (higher fence) touched the account."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class Read:
    balance: int
    last_task: str


class FencedStore:
    """One namespace of the store, on one Redis client."""

    def __init__(self, client: redis.Redis, ns: str) -> None:
        self.client = client
        self.ns = ns
        self._claim = client.register_script(CLAIM)
        self._write = client.register_script(WRITE)

    def key(self, *parts: str) -> str:
        return ":".join((self.ns, *parts))

    # -- what a task body does ----------------------------------------------------------------

    def record_run(self, account: str, task_id: str, pid: int, fence: Any, node: str) -> None:
        self.client.rpush(
            self.key("runs"), f"{account}|{task_id}|{pid}|{time.time():.6f}|{fence}|{node}"
        )

    def claim(self, task_id: str, account: str, fence: int) -> Optional[Read]:
        """Claim the account for ``fence`` and read it; None if ``task_id`` was applied."""
        reply = [
            _text(part) for part in self._claim(keys=self._keys(account)[:2], args=[task_id, fence])
        ]
        if reply[0] == "already":
            self.client.incr(self.key("already"))
            return None
        if reply[0] == "stale":
            self.client.incr(self.key("stale"))
            raise StaleFence(f"claim of {account} with fence {fence} refused: saw {reply[1]}")
        return Read(balance=int(reply[1]), last_task=reply[2])

    def write(self, task_id: str, account: str, cents: int, fence: int, read: Read) -> str:
        """``"applied"``, ``"already"`` or ``"stale"`` (nothing written for the last two)."""
        reply = [
            _text(part)
            for part in self._write(
                keys=self._keys(account),
                args=[task_id, fence, read.balance + cents, read.last_task, account, cents],
            )
        ]
        if reply[0] == "already":
            self.client.incr(self.key("already"))
        elif reply[0] == "stale":
            self.client.incr(self.key("stale"))
        return reply[0]

    def apply(self, task_id: str, account: str, cents: int, fence: int, work: float) -> str:
        """Claim-read, "work", write. Raises ``StaleFence`` when the fence refuses either."""
        read = self.claim(task_id, account, fence)
        if read is None:
            return "already"
        time.sleep(work)
        outcome = self.write(task_id, account, cents, fence, read)
        if outcome == "stale":
            raise StaleFence(f"write of {account} with fence {fence} refused")
        return outcome

    def _keys(self, account: str) -> list[str]:
        return [self.key("acct", account), self.key("applied"), self.key("info")]

    # -- what the test reads afterwards -------------------------------------------------------

    def applied_count(self) -> int:
        return int(self.client.scard(self.key("applied")))

    def counter(self, name: str) -> int:
        return int(self.client.get(self.key(name)) or 0)

    def runs(self) -> list[Run]:
        parsed = []
        for raw in self.client.lrange(self.key("runs"), 0, -1):
            account, task_id, pid, at, fence, node = _text(raw).split("|", 5)
            parsed.append(
                Run(
                    account,
                    task_id,
                    int(pid),
                    float(at),
                    None if fence == "None" else int(fence),
                    node,
                )
            )
        return parsed

    def account(self, account: str) -> tuple[int, Optional[str], int]:
        """(balance, task whose write it is, last claimed fence)."""
        raw = {
            _text(k): _text(v) for k, v in self.client.hgetall(self.key("acct", account)).items()
        }
        return (
            int(raw.get("balance", 0)),
            raw.get("last_task") or None,
            int(raw.get("last_fence", 0)),
        )

    def info(self) -> dict[str, tuple[str, int, int, Optional[str]]]:
        """task id -> (account, cents, fence, the task whose write it read)."""
        found = {}
        for task_id, raw in self.client.hgetall(self.key("info")).items():
            account, cents, fence, read_task = _text(raw).split("|")
            found[_text(task_id)] = (account, int(cents), int(fence), read_task or None)
        return found

    def analyse(self, sent: dict[str, tuple[str, int]]) -> Ledger:
        """Compare what was sent (task id -> (account, cents)) with what the store holds."""
        info = self.info()
        ledger = Ledger(updates=len(sent), applied=len(info))
        for account in sorted({a for a, _ in sent.values()}):
            mine = {t: c for t, (a, c) in sent.items() if a == account}
            balance, last, _ = self.account(account)
            on_chain: Counter[str] = Counter()
            chain_sum, task, steps = 0, last, 0
            while task is not None and steps <= len(info):  # bounded: a chain has no loops
                on_chain[task] += 1
                if on_chain[task] > 1 or task not in info:
                    break
                chain_sum += info[task][1]
                task = info[task][3]
                steps += 1
            applied_here = [t for t, row in info.items() if row[0] == account]
            missing = sum(1 for t in mine if t not in info)
            ledger.missing += missing
            ledger.lost += missing + sum(1 for t in applied_here if t not in on_chain)
            ledger.doubled += sum(n - 1 for n in on_chain.values())
            ledger.unexplained += balance - chain_sum
            if balance != sum(mine.values()):
                ledger.wrong_accounts.append(account)
        ledger.foreign = sum(1 for t in info if t not in sent)
        return ledger


@dataclass
class Run:
    account: str
    task_id: str
    pid: int
    at: float  # time.time() in the worker, as the body started
    fence: Optional[int]
    node: str


@dataclass
class Ledger:
    updates: int
    applied: int
    missing: int = 0
    lost: int = 0
    doubled: int = 0
    unexplained: int = 0  # cents of the balances that no applied update explains
    foreign: int = 0  # applied task ids that were never sent
    wrong_accounts: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return (
            self.applied == self.updates
            and self.lost == 0
            and self.doubled == 0
            and self.unexplained == 0
            and self.foreign == 0
            and not self.wrong_accounts
        )
