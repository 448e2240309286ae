"""Run the balances example: the same random deposits/withdrawals with and without the lock.

    python -m examples.balances --accounts 5 --updates 300
    python -m examples.balances --database-url postgresql://127.0.0.1/test

Prints one table per run (expected vs actual balance, lost and doubled updates per account),
then one JSON line (``{"lost": 0, "doubled": 0, ...}`` for the locked run, the plain run under
``"plain"``). Exit code 0 when the locked run is exact, 1 when it is not, 2 when the example
could not run.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from celery import Celery

from examples.common import (
    Progress,
    Settings,
    Supervisor,
    add_server_arguments,
    add_worker_arguments,
    cleanup,
    configure_app,
    data_client,
    options_from_args,
    run_example,
    show_progress,
    wait_for_workers,
    worker_command,
)

APP = "examples.balances.app"


@dataclass
class Options:
    accounts: int = 5
    updates: int = 300
    workers: int = 2
    concurrency: int = 3
    pool: str = "prefork"
    work_ms: float = 5.0
    seed: Optional[int] = None
    timeout: float = 120.0
    plain: bool = True
    database_url: Optional[str] = None


@dataclass
class Account:
    account: int
    updates: int
    expected: int
    actual: int
    applied: int
    lost: int
    doubled: int
    missing: int


@dataclass
class Ledger:
    """The outcome of one run (``locked`` or ``plain``)."""

    ledger: str
    title: str
    accounts: list[Account]
    seconds: float
    failed: int
    parked: int = 0
    rejected_writes: int = 0
    timed_out: bool = False
    unexplained: int = 0

    def total(self, name: str) -> int:
        return sum(int(getattr(a, name)) for a in self.accounts)

    @property
    def exact(self) -> bool:
        return (
            not self.timed_out
            and self.unexplained == 0
            and all(
                a.expected == a.actual and a.lost == 0 and a.doubled == 0 and a.missing == 0
                for a in self.accounts
            )
        )

    def text(self) -> str:
        updates = self.total("updates")
        head = f"{self.title}: {updates} updates in {self.seconds:.1f}s"
        extras = []
        if self.ledger == "locked":
            extras.append(f"{self.parked} updates parked behind a running one")
            extras.append(f"{self.rejected_writes} writes refused by fence")
        extras.append(f"{self.failed} tasks failed")
        lines = [f"{head} ({', '.join(extras)})"]
        lines.append(
            f"  {'account':>7} {'updates':>7} {'expected':>12} {'actual':>12} "
            f"{'lost':>5} {'doubled':>7}"
        )
        for a in self.accounts:
            lines.append(
                f"  {a.account:>7} {a.updates:>7} {money(a.expected):>12} {money(a.actual):>12} "
                f"{a.lost:>5} {a.doubled:>7}" + ("" if a.expected == a.actual else "  <- wrong")
            )
        lines.append(
            f"  {'total':>7} {updates:>7} {money(self.total('expected')):>12} "
            f"{money(self.total('actual')):>12} {self.total('lost'):>5} "
            f"{self.total('doubled'):>7}"
        )
        missing = self.total("missing")
        if missing:
            lines.append(f"  {missing} updates never applied (failed or not finished)")
        if self.timed_out:
            lines.append("  timed out before every update finished")
        if self.unexplained:
            lines.append(f"  {money(self.unexplained)} of the balances is explained by no update")
        if self.exact:
            lines.append("  EXACT: every update applied exactly once")
        else:
            lost = self.total("lost")
            why = (
                f"{lost} updates lost: two updates of one account read the same balance and "
                "the later write overwrote the earlier one"
                if lost
                else "see above"
            )
            lines.append(f"  NOT EXACT: {why}")
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {
            "lost": self.total("lost"),
            "doubled": self.total("doubled"),
            "missing": self.total("missing"),
            "wrong_accounts": sum(1 for a in self.accounts if a.expected != a.actual),
            "expected_total": self.total("expected"),
            "actual_total": self.total("actual"),
            "exact": self.exact,
            "failed": self.failed,
            "parked": self.parked,
            "rejected_writes": self.rejected_writes,
            "timed_out": self.timed_out,
            "seconds": round(self.seconds, 2),
        }


@dataclass
class Report:
    options: Options
    database: str
    locked: Ledger
    plain: Optional[Ledger]
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.locked.exact

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def text(self) -> str:
        o = self.options
        lines = [
            f"balances: {o.accounts} accounts, {o.updates} random deposits/withdrawals sent at "
            f"once, {o.workers} workers x {o.concurrency} {o.pool} slots, "
            f"{o.work_ms:g} ms between read and write, store {self.database}",
            self.locked.text(),
        ]
        if self.plain is not None:
            lines.append(self.plain.text())
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"example": "balances", "database": self.database}
        data.update(self.locked.as_json())
        data["plain"] = None if self.plain is None else self.plain.as_json()
        data["ok"] = self.ok
        data["options"] = asdict(self.options)
        return data


def money(cents: int) -> str:
    sign = "-" if cents < 0 else ""
    return f"{sign}{abs(cents) // 100}.{abs(cents) % 100:02d}"


def workload(options: Options) -> list[tuple[int, int]]:
    """``updates`` random (account, cents): deposits and withdrawals of 0.01 to 500.00."""
    rng = random.Random(options.seed)
    updates = []
    for _ in range(options.updates):
        cents = rng.randint(1, 50_000) * rng.choice((1, -1))
        updates.append((rng.randint(1, options.accounts), cents))
    return updates


def analyse(
    store: Any, sent: dict[str, tuple[int, int]], accounts: int
) -> tuple[list[Account], int]:
    """Per account: expected vs actual, and which applied updates the final balance is made of.

    The final balance was written by ``last_task_id``, which read the balance written by its
    ``read_task_id``, and so on back to the opening balance: that chain is the updates the
    balance contains. An applied update off the chain was overwritten (lost); one on it twice
    would be counted twice (doubled).
    """
    balances = store.balances()
    applied = store.applied()
    rows, unexplained = [], 0
    for account in range(1, accounts + 1):
        mine = {t: c for t, (a, c) in sent.items() if a == account}
        actual, last = balances.get(account, (0, None))
        on_chain: Counter[str] = Counter()
        chain_sum, task, steps = 0, last, 0
        while task is not None and steps <= len(applied):  # bounded: a chain has no loops
            on_chain[task] += 1
            if on_chain[task] > 1 or task not in applied:
                break
            chain_sum += applied[task][1]
            task = applied[task][2]
            steps += 1
        applied_here = [t for t, (a, _, _) in applied.items() if a == account]
        unexplained += actual - chain_sum
        rows.append(
            Account(
                account=account,
                updates=len(mine),
                expected=sum(mine.values()),
                actual=actual,
                applied=len(applied_here),
                lost=sum(1 for t in applied_here if t not in on_chain),
                doubled=sum(n - 1 for n in on_chain.values()),
                missing=sum(1 for t in mine if t not in applied),
            )
        )
    return rows, unexplained


def run(
    options: Options,
    settings: Settings,
    *,
    progress: bool = False,
    keep_logs: bool = False,
) -> Report:
    """Start the workers, run the locked then the plain workload, stop the workers, report."""
    from examples.balances import app as balances
    from examples.balances.store import Store

    work_dir = Path(tempfile.mkdtemp(prefix=f"csl-{settings.namespace}-"))
    database_url = options.database_url or f"sqlite:///{work_dir / 'ledger.db'}"
    database = "PostgreSQL" if database_url.startswith("postgres") else "SQLite"
    # This process only sends the updates (by name); the workers store results and count
    # finished updates in the data Redis, which is what the runner waits on.
    sender = Celery("balances-runner")
    configure_app(sender, settings)
    sender.conf.result_backend = None
    supervisor = Supervisor(work_dir)
    env = {
        **settings.env(),
        "BALANCES_DATABASE_URL": database_url,
        "BALANCES_WORK_MS": str(options.work_ms),
    }
    ns = settings.namespace
    stores: dict[str, Any] = {}
    report: Optional[Report] = None
    try:
        for ledger in ("locked", "plain"):
            stores[ledger] = Store.open(database_url, ledger)
            stores[ledger].reset(options.accounts)
        for i in range(1, options.workers + 1):
            supervisor.start(
                f"worker-{i}",
                worker_command(
                    APP,
                    f"{ns}-w{i}@%h",
                    pool=options.pool,
                    concurrency=options.concurrency,
                    loglevel="WARNING",
                ),
                env,
            )
        with Progress(options.workers, "starting workers", "ready", progress) as bar:
            wait_for_workers(supervisor, settings, options.workers, on_tick=bar.update_to)
        updates = workload(options)
        locked = run_ledger(
            "locked",
            'LockedTask, lock_on=("account_id",), on_duplicate="queue", lock_fencing=True',
            balances.LOCKED,
            updates,
            sender,
            stores["locked"],
            options,
            settings,
            supervisor,
            progress,
        )
        plain = None
        if options.plain:
            plain = run_ledger(
                "plain",
                "plain Celery Task, no lock, no fence",
                balances.UNLOCKED,
                updates,
                sender,
                stores["plain"],
                options,
                settings,
                supervisor,
                progress,
            )
        supervisor.stop(timeout=10)
        report = Report(options, database, locked, plain)
        if plain is not None and plain.exact:
            report.notes.append(
                "the plain run happened to lose nothing this time: try more updates, fewer "
                "accounts or a longer --work-ms"
            )
        return report
    finally:
        supervisor.stop(timeout=3)
        sender.close()
        keep = keep_logs or report is None or not report.ok
        for store in stores.values():
            store.close()
            if options.database_url and not keep:
                store.drop()  # the schemas made in the given PostgreSQL database
        cleanup(settings)
        if keep and any(work_dir.iterdir()):
            print(f"logs and database kept in {work_dir}", file=sys.stderr)
        else:
            shutil.rmtree(work_dir, ignore_errors=True)


def run_ledger(
    ledger: str,
    title: str,
    task_name: str,
    updates: list[tuple[int, int]],
    sender: Any,
    store: Any,
    options: Options,
    settings: Settings,
    supervisor: Supervisor,
    progress: bool,
) -> Ledger:
    ns = settings.namespace
    client = data_client(settings.data)

    def count(name: str) -> int:
        return int(client.get(f"{ns}:{name}") or 0)

    parked_before, rejected_before = count("duplicates:queue"), count("rejected")
    started = time.monotonic()
    sent: dict[str, tuple[int, int]] = {}
    for account, cents in updates:  # all at once: many updates of one account run together
        reason = "deposit" if cents > 0 else "withdrawal"
        result = sender.send_task(task_name, (account, cents), {"reason": reason})
        sent[result.id] = (account, cents)
    timed_out = False
    with Progress(len(updates), f"balances {ledger}", "updates", progress) as bar:
        deadline = started + options.timeout
        while True:  # bounded by the deadline
            supervisor.check()
            finished = count(f"finished:{ledger}")
            note = f"parked {count('duplicates:queue') - parked_before}"
            bar.update_to(finished, note if ledger == "locked" else "")
            if finished >= len(updates):
                break
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.2)
    seconds = time.monotonic() - started
    accounts, unexplained = analyse(store, sent, options.accounts)
    return Ledger(
        ledger=ledger,
        title=f"{ledger} ({title})",
        accounts=accounts,
        seconds=seconds,
        failed=count(f"failed:{ledger}"),
        parked=count("duplicates:queue") - parked_before,
        rejected_writes=count("rejected") - rejected_before,
        timed_out=timed_out,
        unexplained=unexplained,
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m examples.balances", description=__doc__.split("\n\n")[0]
    )
    d = Options()
    p.add_argument("--accounts", type=int, default=d.accounts)
    p.add_argument("--updates", type=int, default=d.updates, help="tasks sent per run")
    add_worker_arguments(p, d)
    p.add_argument("--work-ms", type=float, default=d.work_ms, help="pause between read/write")
    p.add_argument("--seed", type=int, default=d.seed, help="random seed of the workload")
    p.add_argument("--timeout", type=float, default=d.timeout, help="seconds per run, at most")
    p.add_argument(
        "--no-plain", dest="plain", action="store_false", help="skip the run without the lock"
    )
    p.add_argument(
        "--database-url",
        help="postgresql://... (needs psycopg) or sqlite:////path.db; "
        "default: SQLite in a temporary directory",
    )
    add_server_arguments(p)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    from examples.balances.store import Store, StoreError

    args = parser().parse_args(argv)
    options = options_from_args(Options, args)
    if options.database_url:
        try:  # fail before starting anything: a bad URL, psycopg missing, server down
            Store.open(options.database_url, "locked").check()
        except StoreError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return run_example(
        args,
        "balances",
        lambda settings: run(
            options, settings, progress=show_progress(args), keep_logs=args.keep_logs
        ),
        errors=(StoreError,),
    )
