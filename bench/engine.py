"""Engine benchmark: acquire+release latency against a raw-Redis floor, and batched renewal.

``python -m bench engine [--quick]``. Everything runs in one process against one Redis, and
the contenders are measured side by side: each round runs every contender once (the order
rotates from round to round) and the figures are medians over rounds, so that a noisy,
shared machine slows every contender alike instead of skewing one of them.

``python -m bench engine --cluster [--leases N]`` measures only the renewal, on a throwaway
Redis Cluster of 3 primaries on loopback (or the cluster of ``$REDIS_CLUSTER_URL``): one
cluster pipeline per tick, one round trip per primary.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import platform
import secrets
import sys
import time
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable, Iterator, List, Optional, Sequence

import redis
from redis.cluster import RedisCluster

from celery_singleton_lock.engine import Lease, RedisLocker, Renewer

from ._common import (
    RoundTripCounter,
    command_usec,
    counting_client,
    counting_connection_class,
    fill_defaults,
    median,
    quartiles,
    redis_target,
    server_cpu_seconds,
    server_version,
    verdict,
)

#: Targets from the spec.
MAX_RATIO_TO_FLOOR = 1.15
ENGINE_ROUND_TRIPS_PER_CYCLE = 2  # one to acquire, one to release
RENEW_ROUND_TRIPS_PER_TICK = 1
MAX_TICK_MS = 50.0
TARGET_LEASES = 10_000  # the tick target is stated for this many leases

Cycle = Callable[[], None]


class BenchError(RuntimeError):
    """A contender did not do what was measured (e.g. failed to acquire a free lock)."""


def _pkg_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


# -- contenders: each builds a zero-argument function running one acquire + release ----------


def floor_cycle(client: redis.Redis, prefix: str, ttl: float) -> Cycle:
    """Raw ``SET NX PX`` then ``DEL``, each waiting for its reply, on one connection kept out
    of the pool (as the engine keeps its own): the least any lock can do in 2 round trips."""
    key = f"{prefix}:floor"
    ttl_ms = str(int(ttl * 1000))
    connection = client.connection_pool.get_connection()
    token_hex = secrets.token_hex

    def cycle() -> None:
        connection.send_command("SET", key, token_hex(16), "NX", "PX", ttl_ms)
        if connection.read_response() is None:
            raise BenchError(f"floor: SET NX on free key {key} failed")
        connection.send_command("DEL", key)
        connection.read_response()

    return cycle


def engine_cycle(client: redis.Redis, prefix: str, ttl: float, *, renew: bool) -> Cycle:
    locker = RedisLocker(client, prefix=f"{prefix}-engine", renewer=Renewer(autostart=False))
    name = "renew" if renew else "no-renew"

    def cycle() -> None:
        lease = locker.try_acquire(name, ttl=ttl, renew=renew)
        if not isinstance(lease, Lease):
            raise BenchError(f"engine: lock {name} held by {lease}")
        if not lease.release():
            raise BenchError(f"engine: release of {name} found it no longer ours")

    return cycle


def redis_py_cycle(client: redis.Redis, prefix: str, ttl: float) -> Cycle:
    name = f"{prefix}:redis-py"

    def cycle() -> None:
        lock = client.lock(name, timeout=ttl)
        if not lock.acquire(blocking=False):
            raise BenchError(f"redis-py Lock: free lock {name} not acquired")
        lock.release()  # raises LockNotOwnedError if it was not ours

    return cycle


def python_redis_lock_cycle(client: redis.Redis, prefix: str, ttl: float) -> Cycle:
    import redis_lock

    name = f"{prefix}:python-redis-lock"
    expire = max(1, int(ttl))

    def cycle() -> None:
        lock = redis_lock.Lock(client, name, expire=expire)
        if not lock.acquire(blocking=False):
            raise BenchError(f"python-redis-lock: free lock {name} not acquired")
        lock.release()  # raises NotAcquired if it was not ours

    return cycle


@dataclass
class Contender:
    key: str
    label: str
    build: Callable[[redis.Redis, str, float], Cycle]
    available: bool = True
    #: filled in by the benchmark, one entry per round (microseconds per cycle)
    wall_us: List[float] = field(default_factory=list)
    cpu_us: List[float] = field(default_factory=list)
    server_us: List[float] = field(default_factory=list)
    ratios: List[float] = field(default_factory=list)
    sent_per_cycle: Optional[List[str]] = None
    round_trips: float = 0.0


def contenders() -> List[Contender]:
    try:
        import redis_lock  # noqa: F401

        have_prl = True
    except ImportError:
        have_prl = False
    return [
        Contender("floor", "floor: SET NX PX + DEL", floor_cycle),
        Contender(
            "engine",
            "engine: try_acquire + release (renew=True)",
            lambda c, p, t: engine_cycle(c, p, t, renew=True),
        ),
        Contender(
            "engine-no-renew",
            "engine: try_acquire + release (renew=False)",
            lambda c, p, t: engine_cycle(c, p, t, renew=False),
        ),
        Contender("redis-py", "redis-py Lock: acquire + release", redis_py_cycle),
        Contender(
            "python-redis-lock",
            "python-redis-lock: acquire + release",
            python_redis_lock_cycle,
            available=have_prl,
        ),
    ]


# -- 1. acquire + release latency --------------------------------------------------------------


def timed(cycle: Cycle, cycles: int, info: redis.Redis) -> tuple[float, float, Optional[float]]:
    """Wall, client CPU and server CPU microseconds per cycle over ``cycles`` runs.

    GC is paused while timing, as timeit does. Server CPU comes from INFO cpu, read outside
    the timed loop.
    """
    gc.collect()
    server_start = server_cpu_seconds(info)
    gc.disable()
    try:
        cpu_start, wall_start = time.process_time(), time.perf_counter()
        for _ in range(cycles):
            cycle()
        wall, cpu = time.perf_counter() - wall_start, time.process_time() - cpu_start
    finally:
        gc.enable()
    server_end = server_cpu_seconds(info)
    server = None
    if server_start is not None and server_end is not None:
        server = (server_end - server_start) / cycles * 1e6
    return wall / cycles * 1e6, cpu / cycles * 1e6, server


def count_round_trips(contender: Contender, cycle: Cycle, counter: RoundTripCounter) -> None:
    samples = 10
    cycle()  # connects and loads scripts: not counted
    counter.reset()
    for _ in range(samples):
        cycle()
    sent = list(counter.sent)
    contender.round_trips = len(sent) / samples
    one = sent[: len(sent) // samples]
    contender.sent_per_cycle = one if one * samples == sent else None


def bench_cycles(
    plain: redis.Redis,
    counted: redis.Redis,
    counter: RoundTripCounter,
    prefix: str,
    *,
    rounds: int,
    cycles: int,
    ttl: float,
) -> List[Contender]:
    entries = [c for c in contenders() if c.available]  # the floor comes first
    # Timing uses a plain client; the counting client is only used to count round trips.
    timing = [c.build(plain, prefix, ttl) for c in entries]
    for contender in entries:
        count_round_trips(contender, contender.build(counted, prefix, ttl), counter)
    for cycle in timing:  # warm-up: connections, script cache, CPU caches
        timed(cycle, max(50, cycles // 5), plain)
    for round_no in range(rounds):
        shift = round_no % len(entries)
        for index in list(range(shift, len(entries))) + list(range(shift)):
            wall, cpu, server = timed(timing[index], cycles, plain)
            entries[index].wall_us.append(wall)
            entries[index].cpu_us.append(cpu)
            if server is not None:
                entries[index].server_us.append(server)
        floor = entries[0].wall_us[-1]
        for contender in entries:
            contender.ratios.append(contender.wall_us[-1] / floor)
    return entries


def print_cycles(entries: List[Contender], rounds: int, cycles: int, ttl: float) -> None:
    print(
        f"\n1. acquire + release of a free lock (ttl {ttl:g} s), {rounds} rounds x {cycles} "
        "cycles per contender, interleaved, order rotated each round"
    )
    print(
        f"   {'contender':<44} {'us/cycle':>8} {'best':>6} {'x floor':>7} {'(IQR)':>11} "
        f"{'client CPU':>10} {'server CPU':>10} {'round trips':>11}  sent per cycle"
    )
    for c in entries:
        q1, q3 = quartiles(c.ratios)
        server = f"{median(c.server_us):.1f}" if c.server_us else "n/a"
        sent = " + ".join(c.sent_per_cycle) if c.sent_per_cycle is not None else "varies"
        print(
            f"   {c.label:<44} {median(c.wall_us):>8.1f} {min(c.wall_us):>6.1f} "
            f"{median(c.ratios):>6.2f}x "
            f"{f'({q1:.2f}-{q3:.2f})':>11} {median(c.cpu_us):>10.1f} {server:>10} "
            f"{c.round_trips:>11g}  {sent}"
        )
    for c in contenders():
        if not c.available:
            print(f"   {c.label:<44} skipped: not installed (pip install -e '.[bench]')")
    print(
        "   per cycle, median over rounds (best: fastest round); x floor: median of the per-round "
        "ratios of wall time,\n   the figure to trust on a noisy machine (IQR: their quartiles); "
        "client CPU: this process; server CPU:\n   INFO cpu of redis-server; round trips: "
        "requests sent, connection handshake excluded"
    )


# -- 2. renewal of many leases ----------------------------------------------------------------


class FakeClock:
    """A monotonic clock that only moves when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Tick:
    sent: List[str]
    renewed: int
    wall_ms: float
    cpu_ms: float
    server_ms: Optional[float]


@dataclass
class Renewal:
    leases: int
    ttl: float
    acquire_s: float
    warmup: Tick
    ticks: List[Tick]


def renew_tick(
    renewer: Renewer,
    clock: FakeClock,
    leases: Sequence[Lease],
    plain: Any,
    counter: RoundTripCounter,
    step: float,
) -> Tick:
    clock.advance(step)
    gc.collect()
    usec_before = evalsha_usec(plain)
    counter.reset()
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    renewer.run_once()
    wall, cpu = time.perf_counter() - wall_start, time.process_time() - cpu_start
    sent = list(counter.sent)
    usec_after = evalsha_usec(plain)
    server_ms = None
    if usec_before is not None and usec_after is not None:
        server_ms = (usec_after - usec_before) / 1000.0
    renewed = sum(1 for lease in leases if lease.held and lease.confirmed_at == clock.now)
    return Tick(sent, renewed, wall * 1000.0, cpu * 1000.0, server_ms)


def evalsha_usec(client: Any) -> Optional[int]:
    """Server microseconds spent in EVALSHA so far: summed over the primaries of a cluster."""
    if not isinstance(client, RedisCluster):
        return command_usec(client, "evalsha")
    total = 0
    for node in client.get_primaries():
        usec = command_usec(client.get_redis_connection(node), "evalsha")
        if usec is None:
            return None
        total += usec
    return total


def bench_renewal(
    plain: Any,
    counted: Any,
    counter: RoundTripCounter,
    prefix: str,
    *,
    leases: int,
    ticks: int,
    ttl: float,
) -> Renewal:
    clock = FakeClock()
    renewer = Renewer(autostart=False, clock=clock)
    locker = RedisLocker(counted, prefix=f"{prefix}-renew", renewer=renewer)
    start = time.perf_counter()
    held: List[Lease] = []
    for i in range(leases):
        lease = locker.try_acquire(f"lease-{i}", ttl=ttl)
        if not isinstance(lease, Lease):
            raise BenchError(f"renewal: lock lease-{i} held by {lease}")
        held.append(lease)
    acquire_s = time.perf_counter() - start
    step = ttl / 3.0 + 0.001  # just past the due time of every lease
    try:
        warmup = renew_tick(renewer, clock, held, plain, counter, step)
        measured = [renew_tick(renewer, clock, held, plain, counter, step) for _ in range(ticks)]
    finally:
        for lease in held:
            renewer.discard(lease)
        keys = [lease.key for lease in held]
        for i in range(0, len(keys), 1000):
            plain.delete(*keys[i : i + 1000])  # a cluster client splits it by slot
    return Renewal(leases, ttl, acquire_s, warmup, measured)


def print_renewal(result: Renewal) -> None:
    n, ttl = result.leases, result.ttl
    print(
        f"\n2. renewal of {n} leases held in one process (ttl {ttl:g} s): Renewer(autostart="
        f"False, fake clock) advanced {ttl / 3:.1f} s per tick, then run_once()"
    )
    print(
        f"   acquiring them: {result.acquire_s:.2f} s ({result.acquire_s / n * 1e6:.0f} us each, "
        "one by one)"
    )

    def row(label: str, tick: Tick) -> str:
        sent = ", ".join(tick.sent) if len(tick.sent) <= 4 else f"{len(tick.sent)} requests"
        server = "n/a" if tick.server_ms is None else f"{tick.server_ms:.1f}"
        return (
            f"   {label:<8} {len(tick.sent):>11} {sent:<34} {tick.renewed:>6}/{n:<6} "
            f"{tick.wall_ms:>8.1f} {tick.cpu_ms:>13.1f} {server:>9}"
        )

    print(
        f"   {'tick':<8} {'round trips':>11} {'sent':<34} {'renewed':>13} "
        f"{'wall ms':>8} {'client CPU ms':>13} {'server ms':>9}"
    )
    print(row("warm-up", result.warmup))
    for i, tick in enumerate(result.ticks, 1):
        print(row(str(i), tick))
    ticks = result.ticks
    servers = [t.server_ms for t in ticks if t.server_ms is not None]
    server = f"{median(servers):.1f}" if len(servers) == len(ticks) else "n/a"
    trips, renewed = median([len(t.sent) for t in ticks]), median([t.renewed for t in ticks])
    wall, cpu = median([t.wall_ms for t in ticks]), median([t.cpu_ms for t in ticks])
    print(
        f"   {'median':<8} {trips:>11g} {'':<34} {renewed:>6g}/{n:<6} {wall:>8.1f} {cpu:>13.1f} "
        f"{server:>9}"
    )
    print(
        "   wall: run_once() end to end; client CPU: time.process_time() of this process; "
        "server: INFO commandstats usec of EVALSHA"
    )


# -- main ---------------------------------------------------------------------------------------


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench engine",
        description="Engine benchmark: acquire+release latency vs a raw SET NX/DEL floor and "
        "other Redis locks (interleaved rounds), and batched renewal of many leases.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="shorter run (~10 s): 25 rounds x 200 cycles, 5 ticks"
    )
    parser.add_argument("--rounds", type=int, help="rounds of the latency part (default 45)")
    parser.add_argument("--cycles", type=int, help="cycles per contender and round (default 300)")
    parser.add_argument(
        "--leases", type=int, default=TARGET_LEASES, help="leases renewed per tick (default 10000)"
    )
    parser.add_argument("--ticks", type=int, help="measured renewal ticks (default 7)")
    parser.add_argument("--ttl", type=float, default=30.0, help="lock TTL in seconds (default 30)")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="renewal only, on a Redis Cluster: $REDIS_CLUSTER_URL (any node), else a "
        "throwaway one of 3 primaries on loopback",
    )
    args = parser.parse_args(list(argv))
    defaults = {"rounds": (25, 45), "cycles": (200, 300), "ticks": (5, 7)}
    fill_defaults(parser, args, defaults, ("rounds", "cycles", "leases", "ticks"))
    if not args.ttl >= 1:
        parser.error("--ttl must be at least 1 second")
    return args


@contextlib.contextmanager
def cluster_url() -> Iterator[str]:
    """``$REDIS_CLUSTER_URL`` if set, else a throwaway cluster of 3 primaries on loopback."""
    url = os.environ.get("REDIS_CLUSTER_URL")
    if url:
        yield url
        return
    from tests.cluster_topology import ClusterGroup  # the test suite's own topology helper

    with ClusterGroup.running() as group:
        yield group.url


def main_cluster(args: argparse.Namespace) -> int:
    """Renewal of ``args.leases`` leases on a Redis Cluster: ms and round trips per tick."""
    prefix = f"bench-{secrets.token_hex(4)}"
    with cluster_url() as url:
        counter = RoundTripCounter()
        plain = RedisCluster.from_url(url)
        counted = RedisCluster.from_url(
            url, connection_class=counting_connection_class(url, counter)
        )
        try:
            primaries = len(plain.get_primaries())
            print(
                f"engine benchmark on a Redis Cluster of {primaries} primaries "
                f"(redis {server_version(plain.get_redis_connection(plain.get_primaries()[0]))}), "
                f"python {platform.python_version()}, redis-py {_pkg_version('redis')}"
            )
            renewal = bench_renewal(
                plain, counted, counter, prefix, leases=args.leases, ticks=args.ticks, ttl=args.ttl
            )
            print_renewal(renewal)
        finally:
            plain.close()
            counted.close()
    ticks = renewal.ticks
    trips = max(len(t.sent) for t in ticks)
    print(
        f"verdicts: renewal {trips} round trip(s)/tick (<= {primaries} primaries) "
        f"{verdict(trips <= primaries)}; renewal {median([t.wall_ms for t in ticks]):.1f} "
        f"ms/tick for {renewal.leases} leases; every lease renewed every tick "
        f"{verdict(all(t.renewed == renewal.leases for t in ticks))}"
    )
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.cluster:
        return main_cluster(args)
    started = time.perf_counter()
    prefix = f"bench-{secrets.token_hex(4)}"  # never collides with another run or real keys
    with redis_target() as target:
        plain = redis.Redis.from_url(target.url)
        counter = RoundTripCounter()
        counted = counting_client(target.url, counter)
        try:
            print(
                f"engine benchmark: redis {server_version(plain)} ({target.description}), "
                f"python {platform.python_version()}, redis-py {_pkg_version('redis')}, "
                f"python-redis-lock {_pkg_version('python-redis-lock')}"
            )
            entries = bench_cycles(
                plain,
                counted,
                counter,
                prefix,
                rounds=args.rounds,
                cycles=args.cycles,
                ttl=args.ttl,
            )
            print_cycles(entries, args.rounds, args.cycles, args.ttl)
            renewal = bench_renewal(
                plain,
                counted,
                counter,
                prefix,
                leases=args.leases,
                ticks=args.ticks,
                ttl=args.ttl,
            )
            print_renewal(renewal)
        finally:
            plain.close()
            counted.connection_pool.disconnect()

    engine = next(c for c in entries if c.key == "engine")
    ratio = median(engine.ratios)
    ticks = renewal.ticks
    tick_trips = sorted({len(t.sent) for t in ticks})
    one_trip = tick_trips == [RENEW_ROUND_TRIPS_PER_TICK] and all(
        t.sent == ["EVALSHA"] for t in ticks
    )
    all_renewed = all(t.renewed == renewal.leases for t in ticks)
    tick_ms = median([t.wall_ms for t in ticks])
    print(f"\ndone in {time.perf_counter() - started:.1f} s")
    print(
        "verdicts: "
        f"engine acquire+release {ratio:.2f}x floor (<= {MAX_RATIO_TO_FLOOR}x) "
        f"{verdict(ratio <= MAX_RATIO_TO_FLOOR)}; "
        f"engine {engine.round_trips:g} round trips/cycle (= {ENGINE_ROUND_TRIPS_PER_CYCLE}) "
        f"{verdict(engine.round_trips == ENGINE_ROUND_TRIPS_PER_CYCLE)}; "
        f"renewal {'/'.join(map(str, tick_trips))} round trip(s)/tick "
        f"(= {RENEW_ROUND_TRIPS_PER_TICK} EVALSHA) {verdict(one_trip)}; "
        f"renewal {tick_ms:.1f} ms/tick for {renewal.leases} leases (<= {MAX_TICK_MS:g} ms"
        f"{'' if renewal.leases == TARGET_LEASES else f' at {TARGET_LEASES}'}) "
        f"{verdict(tick_ms <= MAX_TICK_MS)}; "
        f"every lease renewed every tick {verdict(all_renewed)}"
    )
    return 0
