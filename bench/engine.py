"""Engine benchmark: acquire+release latency against a raw-Redis floor, and batched renewal.

``python -m bench engine [--quick]``. Everything runs in one process against one Redis, and
the contenders (``bench/_contenders.py``) are measured side by side by the paired loop
(``bench/_paired.py``): every contender once per cycle, in a random order, call by call, and
the figures are medians over rounds, so that a noisy, shared machine slows every contender
alike instead of skewing one of them.

``python -m bench engine --cluster [--leases N]`` measures only the renewal, on a throwaway
Redis Cluster of 3 primaries on loopback (or the cluster of ``$REDIS_CLUSTER_URL``): one
cluster pipeline per tick, one round trip per primary.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import redis
from redis.cluster import RedisCluster

from celery_singleton_lock.engine import Lease, RedisLocker, Renewer

from ._builds import EngineSetup
from ._common import (
    BenchError,
    RoundTripCounter,
    command_usec,
    counting_client,
    counting_connection_class,
    fill_defaults,
    med_iqr,
    median,
    new_prefix,
    redis_target,
    server_cpu_seconds,
    server_version,
    verdict,
    versions,
)
from ._contenders import Contender, pick
from ._paired import Call, Paired, paired_calls

#: The contenders of part 1 (``bench/_contenders.py``), the floor first.
KEYS = (
    "floor",
    "locked",
    "locked-no-renew",
    "redis-py",
    "python-redis-lock",
    "once",
    "singleton",
)

#: Targets from the spec.
MAX_RATIO_TO_FLOOR = 1.15
ENGINE_ROUND_TRIPS_PER_CYCLE = 2  # one to acquire, one to release
RENEW_ROUND_TRIPS_PER_TICK = 1
MAX_TICK_MS = 50.0
TARGET_LEASES = 10_000  # the tick target is stated for this many leases


# -- 1. acquire + release latency --------------------------------------------------------------


@dataclass
class Cost:
    """What one acquire + release of a contender sends, and costs the server."""

    round_trips: float
    sent_per_cycle: Optional[List[str]]  # None: not the same every cycle
    server_us: Optional[float]


def cost_of(counted: Call, timing: Call, counter: RoundTripCounter, info: redis.Redis) -> Cost:
    """Requests sent by 10 cycles on a counting client; server CPU of 300 cycles of this
    contender alone (``INFO cpu`` cannot tell apart contenders that alternate call by call)."""
    samples = 10
    counted(0)  # connects and loads scripts: not counted
    counter.reset()
    for i in range(samples):
        counted(i)
    sent = list(counter.sent)
    one = sent[: len(sent) // samples]
    cycles = 300
    before = server_cpu_seconds(info)
    for i in range(cycles):
        timing(i)
    after = server_cpu_seconds(info)
    server = None if before is None or after is None else (after - before) / cycles * 1e6
    return Cost(len(sent) / samples, one if one * samples == sent else None, server)


def bench_cycles(
    plain: redis.Redis,
    counted: redis.Redis,
    counter: RoundTripCounter,
    prefix: str,
    *,
    rounds: int,
    cycles: int,
    ttl: float,
) -> Tuple[Paired, List[Contender], Dict[str, Cost]]:
    usable = [c for c in pick(KEYS, "engine") if not c.missing()]
    calls: Dict[str, Call] = {}
    costs: Dict[str, Cost] = {}
    for c in usable:
        assert c.engine is not None
        name = f"{prefix}:{c.key}"
        # timing uses a plain client; the counting client only counts round trips
        calls[c.key] = c.engine(EngineSetup(plain, prefix, ttl), name)
        counting = c.engine(EngineSetup(counted, prefix, ttl), name)
        costs[c.key] = cost_of(counting, calls[c.key], counter, plain)
    keys = [c.key for c in usable]
    paired = paired_calls(
        keys, [calls[k] for k in keys], rounds=rounds, cycles=cycles, warmup=max(50, cycles // 5)
    )
    return paired, usable, costs


def print_cycles(
    paired: Paired, usable: List[Contender], costs: Dict[str, Cost], cycles: int, ttl: float
) -> None:
    kept, total = paired.kept("wall")
    print(
        f"\n1. acquire + release of a free lock (ttl {ttl:g} s), {len(paired.rounds)} rounds x "
        f"{cycles} cycles, every contender once per cycle\n   in a random order (alternated "
        f"call by call), {kept}/{total} cycles kept"
    )
    print(
        f"   {'contender':<44} {'us/cycle':>8} {'best':>6} {'x floor [IQR]':>19} "
        f"{'client CPU':>10} {'server CPU':>10} {'round trips':>11}  sent per cycle"
    )
    for c in usable:
        cost, wall = costs[c.key], paired.values("wall", c.key)
        server = f"{cost.server_us:.1f}" if cost.server_us is not None else "n/a"
        sent = " + ".join(cost.sent_per_cycle) if cost.sent_per_cycle is not None else "varies"
        print(
            f"   {c.engine_label:<44} {median(wall):>8.1f} {min(wall):>6.1f} "
            f"{med_iqr(paired.ratios('wall', c.key, 'floor'), '.2f'):>19} "
            f"{median(paired.values('cpu', c.key)):>10.1f} {server:>10} "
            f"{cost.round_trips:>11g}  {sent}"
        )
    for c in pick(KEYS, "engine"):
        if c.missing():
            print(f"   {c.engine_label:<44} skipped: {c.missing()} (pip install -e '.[bench]')")
    print(
        "   per cycle, mean over kept cycles, median over rounds (best: fastest round); x floor: "
        "median of the per-round\n   ratios of wall time, the figure to trust on a noisy "
        "machine [IQR: their quartiles]; client CPU: this\n   process; server CPU: INFO cpu of "
        "redis-server, 300 cycles of the contender alone; round trips: requests\n   sent, "
        "connection handshake excluded"
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
    for node in client.get_primaries():  # type: ignore[no-untyped-call]
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


@contextlib.contextmanager
def clients(url: str, cluster: bool) -> Iterator[Tuple[Any, Any, RoundTripCounter]]:
    """A plain client of ``url`` (timing) and one counting its requests into the counter."""
    counter = RoundTripCounter()
    if cluster:
        connection_class = counting_connection_class(url, counter)
        plain: Any = RedisCluster.from_url(url)
        counted: Any = RedisCluster.from_url(url, connection_class=connection_class)
    else:
        plain, counted = redis.Redis.from_url(url), counting_client(url, counter)
    try:
        yield plain, counted, counter
    finally:
        plain.close()
        counted.close()


def main_cluster(args: argparse.Namespace) -> int:
    """Renewal of ``args.leases`` leases on a Redis Cluster: ms and round trips per tick."""
    with cluster_url() as url, clients(url, cluster=True) as (plain, counted, counter):
        primaries = plain.get_primaries()
        print(
            f"engine benchmark on a Redis Cluster of {len(primaries)} primaries (redis "
            f"{server_version(plain.get_redis_connection(primaries[0]))}), {versions('redis')}"
        )
        renewal = bench_renewal(
            plain,
            counted,
            counter,
            new_prefix(),
            leases=args.leases,
            ticks=args.ticks,
            ttl=args.ttl,
        )
        print_renewal(renewal)
    ticks = renewal.ticks
    trips = max(len(t.sent) for t in ticks)
    print(
        f"verdicts: renewal {trips} round trip(s)/tick (<= {len(primaries)} primaries) "
        f"{verdict(trips <= len(primaries))}; renewal {median([t.wall_ms for t in ticks]):.1f} "
        f"ms/tick for {renewal.leases} leases; every lease renewed every tick "
        f"{verdict(all(t.renewed == renewal.leases for t in ticks))}"
    )
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.cluster:
        return main_cluster(args)
    started = time.perf_counter()
    prefix = new_prefix()
    try:
        with redis_target() as target, clients(target.url, False) as (plain, counted, counter):
            print(
                f"engine benchmark: redis {server_version(plain)} ({target.description}), "
                + versions("redis", "python-redis-lock", "celery-once", "celery-singleton")
            )
            paired, usable, costs = bench_cycles(
                plain,
                counted,
                counter,
                prefix,
                rounds=args.rounds,
                cycles=args.cycles,
                ttl=args.ttl,
            )
            print_cycles(paired, usable, costs, args.cycles, args.ttl)
            renewal = bench_renewal(
                plain, counted, counter, prefix, leases=args.leases, ticks=args.ticks, ttl=args.ttl
            )
            print_renewal(renewal)
    except BenchError as exc:
        print(f"engine benchmark FAILED: {exc}", file=sys.stderr)
        return 1
    ratio = median(paired.ratios("wall", "locked", "floor"))
    engine_trips = costs["locked"].round_trips
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
        f"engine {engine_trips:g} round trips/cycle (= {ENGINE_ROUND_TRIPS_PER_CYCLE}) "
        f"{verdict(engine_trips == ENGINE_ROUND_TRIPS_PER_CYCLE)}; "
        f"renewal {'/'.join(map(str, tick_trips))} round trip(s)/tick "
        f"(= {RENEW_ROUND_TRIPS_PER_TICK} EVALSHA) {verdict(one_trip)}; "
        f"renewal {tick_ms:.1f} ms/tick for {renewal.leases} leases (<= {MAX_TICK_MS:g} ms"
        f"{'' if renewal.leases == TARGET_LEASES else f' at {TARGET_LEASES}'}) "
        f"{verdict(tick_ms <= MAX_TICK_MS)}; "
        f"every lease renewed every tick {verdict(all_renewed)}"
    )
    return 0
