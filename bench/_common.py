"""Helpers shared by the benchmarks: a Redis to measure against, round-trip counting, stats,
versions, options and clean-up."""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import statistics
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Iterator, List, Optional, Sequence
from urllib.parse import urlsplit, urlunsplit

import redis

from celery_singleton_lock.testing import RedisServer

#: Commands redis-py sends on its own when it opens a connection; not counted as round trips.
HANDSHAKE = frozenset({"HELLO", "CLIENT", "AUTH", "SELECT"})

#: Sent by redis-py on a connection idle longer than its ``health_check_interval`` (the
#: plugin's client uses 30 s): connection upkeep, shown apart rather than charged to a task.
HEALTH_CHECK = "PING"


class BenchError(RuntimeError):
    """The run did not do what was measured (a free lock not acquired, lost or failed tasks,
    locks left behind): the benchmark stops with exit code 1 rather than print figures."""


def new_prefix() -> str:
    """A key prefix of its own for one run: never collides with another run or real keys."""
    return f"bench-{secrets.token_hex(4)}"


def pkg_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def versions(*names: str) -> str:
    """``python X, redis-py Y, ...``: what the figures were measured with."""
    import platform

    shown = {"redis": "redis-py"}
    return ", ".join(
        [f"python {platform.python_version()}"]
        + [f"{shown.get(name, name)} {pkg_version(name)}" for name in names]
    )


@dataclass
class Target:
    """The Redis server a benchmark runs against."""

    url: str
    description: str


def redact(url: str) -> str:
    """``url`` without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + netloc))


@contextlib.contextmanager
def redis_target() -> Iterator[Target]:
    """``$REDIS_URL`` if set, else a throwaway ``redis-server`` on a free loopback port."""
    url = os.environ.get("REDIS_URL")
    if url:
        yield Target(url, f"REDIS_URL={redact(url)}")
        return
    with RedisServer.running() as server:
        yield Target(server.url, f"throwaway redis-server on 127.0.0.1:{server.port}")


@contextlib.contextmanager
def lock_target(broker: Target, separate: bool) -> Iterator[Target]:
    """The Redis of the locks: the broker's, or a throwaway ``redis-server`` of its own."""
    if not separate:
        yield broker
        return
    with RedisServer.running() as server:
        yield Target(server.url, f"locks: throwaway redis-server on 127.0.0.1:{server.port}")


def delete_matching(client: redis.Redis, patterns: Sequence[str]) -> None:
    """Delete every key matching one of ``patterns`` (SCAN, then DEL by thousands)."""
    for pattern in patterns:
        keys = list(client.scan_iter(match=pattern, count=1000))
        for i in range(0, len(keys), 1000):
            client.delete(*keys[i : i + 1000])


class RoundTripCounter:
    """Requests sent to Redis by counting clients: one per command, one per pipelined batch.

    ``sent`` lists them by command name (``PIPELINE`` for a pipelined batch), in order.
    """

    def __init__(self) -> None:
        self.sent: List[str] = []

    def reset(self) -> None:
        self.sent = []

    def __len__(self) -> int:
        return len(self.sent)


def text(value: Any) -> str:
    """A reply as text (redis-py gives bytes unless ``decode_responses``)."""
    return value.decode() if isinstance(value, bytes) else str(value)


class _CountingMixin:
    """Mixed in before a redis-py connection class; counts what it sends."""

    counter: RoundTripCounter
    _sending = 0  # depth of send_command calls, so their packed send is not counted twice

    def send_command(self, *args: Any, **kwargs: Any) -> Any:
        name = text(args[0]).upper()
        if name not in HANDSHAKE:
            if name == "SCRIPT" and len(args) > 1:  # SCRIPT LOAD, after a NOSCRIPT reply
                name = f"{name} {text(args[1]).upper()}"
            self.counter.sent.append(name)
        self._sending += 1
        try:
            return super().send_command(*args, **kwargs)  # type: ignore[misc]
        finally:
            self._sending -= 1

    def send_packed_command(self, command: Any, check_health: bool = True) -> Any:
        if not self._sending:  # packed by the caller: one command, or a pipeline's batch
            self.counter.sent.append(packed_request(command))
        return super().send_packed_command(command, check_health)  # type: ignore[misc]


def packed_request(command: Any) -> str:
    """What a packed send is, as a round trip: the command's name when it holds one command
    (the lock's hot path packs its commands itself), else ``PIPELINE`` (a batch)."""
    data = command if isinstance(command, bytes) else b"".join(command)
    names, at = [], 0
    while at < len(data):  # RESP arrays of bulk strings: *N, then N x ($len, data)
        end = data.index(b"\r\n", at)
        count, at = int(data[at + 1 : end]), end + 2
        for index in range(count):
            end = data.index(b"\r\n", at)
            length = int(data[at + 1 : end])
            if index == 0:
                names.append(data[end + 2 : end + 2 + length].decode().upper())
            at = end + 2 + length + 2
    return names[0] if len(names) == 1 else "PIPELINE"


def counting_client(url: str, counter: RoundTripCounter, **options: Any) -> redis.Redis:
    """A client of ``url`` whose connections report every request to ``counter``.

    Works for whatever connection class the URL selects (TCP, TLS, unix socket).
    """
    pool = redis.ConnectionPool.from_url(url, **options)
    pool.connection_class = _counting_class(pool.connection_class, counter)
    return redis.Redis(connection_pool=pool)


def counting_connection_class(url: str, counter: RoundTripCounter) -> type:
    """A connection class for ``url`` reporting every request to ``counter``.

    For code that builds its own client from options, e.g. ``connection_class=`` passed to
    ``redis.Redis.from_url`` (which lets that keyword win over the class the URL selects).
    """
    return _counting_class(redis.ConnectionPool.from_url(url).connection_class, counter)


def _counting_class(base: type, counter: RoundTripCounter) -> type:
    return type(f"Counting{base.__name__}", (_CountingMixin, base), {"counter": counter})


def server_version(client: redis.Redis) -> str:
    info = client.info("server")
    return str(info.get("redis_version", "?"))


def command_usec(client: redis.Redis, command: str) -> Optional[int]:
    """Server-side microseconds spent in ``command`` so far (INFO commandstats), or None."""
    try:
        stats = client.info("commandstats")
    except redis.exceptions.ResponseError:
        return None
    entry = stats.get(f"cmdstat_{command.lower()}")
    if not isinstance(entry, dict) or "usec" not in entry:
        return 0 if entry is None else None
    return int(entry["usec"])


def server_cpu_seconds(client: redis.Redis) -> Optional[float]:
    """CPU seconds the server process has used so far (INFO cpu: getrusage, in microseconds)."""
    try:
        info = client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    except (redis.exceptions.ResponseError, KeyError, ValueError):
        return None


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    """First and third quartiles (the median of a single value for tiny samples)."""
    if len(values) < 2:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def med_iqr(values: Sequence[float], fmt: str = ".1f") -> str:
    """``median [q1..q3]``: a figure over rounds and how much the rounds agree."""
    q1, q3 = quartiles(values)
    return f"{median(values):{fmt}} [{q1:{fmt}}..{q3:{fmt}}]"


def distinct(values: Sequence[float]) -> str:
    """``2`` when every round gave 2, ``2/3`` when rounds differ."""
    return "/".join(f"{value:g}" for value in sorted(set(values)))


def verdict(met: bool) -> str:
    return "MET" if met else "NOT MET"


def fill_defaults(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    defaults: dict[str, tuple[Any, Any]],
    positive: Sequence[str],
) -> None:
    """Set each option of ``defaults`` left out to its ``(--quick, full)`` value; the options
    named in ``positive`` must be at least 1."""
    for name, (quick, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    for name in positive:
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")


def sized_options(
    module: str,
    description: Optional[str],
    argv: Optional[Sequence[str]],
    option: str,
    sizes: tuple[int, int],
    *extra: tuple[str, int, str],
) -> argparse.Namespace:
    """``--quick`` and ``--<option>`` (how many; ``sizes`` is (quick, full)) of a counting
    benchmark (the module ``bench.NAME``), and ``extra`` integer options as (name, default,
    help)."""
    prog = f"python -m bench {module.rsplit('.', 1)[-1]}"
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(f"--{option}", type=int, help=f"default {sizes[1]:,}; --quick {sizes[0]:,}")
    parser.add_argument("--quick", action="store_true", help=f"{option}: {sizes[0]:,}")
    for name, default, text in extra:
        parser.add_argument(f"--{name}", type=int, default=default, help=f"{text} ({default})")
    args = parser.parse_args(argv)
    fill_defaults(parser, args, {option: sizes}, (option,))
    return args


def rounds_and_cycles(
    prog: str, description: Optional[str], argv: Sequence[str], rounds: tuple[int, int]
) -> argparse.Namespace:
    """``--rounds``, ``--cycles`` and ``--quick`` of a small engine-level benchmark;
    ``rounds`` is (quick, full), cycles are 100 (quick) or 300 per contender and round."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--rounds", type=int, help=f"rounds (default {rounds[1]})")
    parser.add_argument("--cycles", type=int, help="acquire+release per contender and round (300)")
    parser.add_argument("--quick", action="store_true", help=f"{rounds[0]} rounds of 100 cycles")
    args = parser.parse_args(list(argv))
    fill_defaults(parser, args, {"rounds": rounds, "cycles": (100, 300)}, ("rounds", "cycles"))
    return args


def stop_workers(group: Any, failed: bool) -> None:
    """Stop a ``tests.celery.workers.WorkerGroup``; print its logs if the run failed."""
    group.stop_all()
    if failed:
        print(group.logs(), file=sys.stderr)
    shutil.rmtree(group.log_dir, ignore_errors=True)


@contextlib.contextmanager
def worker_group(servers: Any) -> Iterator[Any]:
    """A ``tests.celery.workers.WorkerGroup`` of ``servers``, stopped at the end: its logs are
    printed only if the run failed (the tests' own ``worker_group`` prints them always)."""
    from tests.celery.workers import WorkerGroup

    group = WorkerGroup(servers)
    failed = True
    try:
        yield group
        failed = False
    finally:
        stop_workers(group, failed)
