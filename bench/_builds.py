"""How each contender of the registry (``bench/_contenders.py``) is built.

Engine level: ``(EngineSetup, lock name) -> call``, a call taking and releasing a free lock on
the setup's client (no Celery). Worker level: ``(WorkerSetup, task name) -> task``, a no-op
task registered on the setup's app whose lock is taken and released around the body, its lock
client counting its own requests (``WorkerSetup.connection_class``), apart from the broker's.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, List, Optional, Sequence

import redis
from celery import Celery, Task

from celery_singleton_lock.arguments import ArgumentKeyer
from celery_singleton_lock.celery import LockedTask
from celery_singleton_lock.celery.config.lockers import forget_locker
from celery_singleton_lock.celery.config.servers import make_client
from celery_singleton_lock.engine import Lease, Owner, QuorumLocker, RedisLocker, Renewer
from celery_singleton_lock.engine.acquire_request import GeneralAcquire, check

from ._common import BenchError, RoundTripCounter, counting_connection_class
from ._paired import Call


@dataclass
class EngineSetup:
    """What an engine-level contender is built on."""

    client: redis.Redis  # the lock server (a primary with a replica for ``locked-replica``)
    prefix: str
    ttl: float = 30.0
    quorum: Sequence[redis.Redis] = ()  # the servers of ``quorum``
    closers: List[Callable[[], None]] = field(default_factory=list)  # run at the end


@dataclass
class WorkerSetup:
    """What a worker-level contender is built on: one app shared by every contender."""

    app: Celery
    url: str  # the lock server
    prefix: str
    counter: RoundTripCounter  # this contender's lock requests
    closers: List[Callable[[], None]] = field(default_factory=list)  # run at the end

    @property
    def connection_class(self) -> type:
        """A redis-py connection class for the lock server counting into ``counter``."""
        return counting_connection_class(self.url, self.counter)


#: engine level: (setup, lock name) -> one acquire + release of a free lock
EngineBuild = Callable[[EngineSetup, str], Call]
#: worker level: (setup, task name) -> the registered task
WorkerBuild = Callable[[WorkerSetup, str], Any]


# -- engine level: one acquire + release -------------------------------------------------------


def floor_cycle(setup: EngineSetup, name: str) -> Call:
    """Raw ``SET NX PX`` then ``DEL``, each waiting for its reply, on one connection kept out
    of the pool (as the engine keeps its own): the least any lock can do in 2 round trips."""
    ttl_ms = str(int(setup.ttl * 1000))
    connection = setup.client.connection_pool.get_connection()
    token_hex = secrets.token_hex

    def cycle(_: int) -> None:
        connection.send_command("SET", name, token_hex(16), "NX", "PX", ttl_ms)  # type: ignore[no-untyped-call]
        if connection.read_response() is None:
            raise BenchError(f"floor: SET NX on free key {name} failed")
        connection.send_command("DEL", name)  # type: ignore[no-untyped-call]
        connection.read_response()

    return cycle


def lease_cycle(locker: Any, name: str, ttl: float, **acquire: Any) -> Call:
    """``try_acquire`` then ``release`` on ``locker`` (the engine, one server or a quorum)."""

    def cycle(_: int) -> None:
        lease = locker.try_acquire(name, ttl=ttl, **acquire)
        if not isinstance(lease, Lease):
            raise BenchError(f"engine: lock {name} held by {lease}")
        if not lease.release():
            raise BenchError(f"engine: release of {name} found it no longer ours")

    return cycle


def engine_cycle(**acquire: Any) -> EngineBuild:
    def build(setup: EngineSetup, name: str) -> Call:
        renewer = Renewer(autostart=False)  # a lease is registered, no thread renews it
        locker = RedisLocker(setup.client, prefix=f"{setup.prefix}-engine", renewer=renewer)
        return lease_cycle(locker, name, setup.ttl, **acquire)

    return build


def rule_cycle(setup: EngineSetup, name: str) -> Call:
    """The mutex that reads its task's live rule (a cap and a pause, engine live_rules.py) in
    the same script call, as every LockedTask's acquire does on one server: none is set, so
    it takes the lock (the read is all it adds)."""
    renewer = Renewer(autostart=False)
    locker = RedisLocker(setup.client, prefix=f"{setup.prefix}-engine", renewer=renewer)
    return lease_cycle(locker, name, setup.ttl, cap_key=f"{setup.prefix}-engine:cap:bench")


def slots_cycle(limit: int, busy: int = 0) -> EngineBuild:
    """``lock_limit``: acquire + release of one of ``limit`` slots, ``busy`` of them held by
    others all along (the acquire reads past them)."""

    def build(setup: EngineSetup, name: str) -> Call:
        renewer = Renewer(autostart=False)
        locker = RedisLocker(setup.client, prefix=f"{setup.prefix}-engine", renewer=renewer)
        for _ in range(busy):
            held = locker.try_acquire(name, ttl=3600, limit=limit, renew=False)
            if not isinstance(held, Lease):
                raise BenchError(f"engine: slot of {name} not taken: {held}")
        return lease_cycle(locker, name, setup.ttl, limit=limit)

    return build


def quorum_cycle(setup: EngineSetup, name: str) -> Call:
    """Acquire and release sent to every server at once from the quorum's thread pool."""
    renewer = Renewer(autostart=False)
    locker = QuorumLocker(list(setup.quorum), prefix=f"{setup.prefix}-quorum", renewer=renewer)
    setup.closers.append(locker.close)  # its thread pool
    return lease_cycle(locker, name, setup.ttl, renew=False)


def redis_py_cycle(setup: EngineSetup, name: str) -> Call:
    client, ttl = setup.client, setup.ttl

    def cycle(_: int) -> None:
        lock = client.lock(name, timeout=ttl)
        if not lock.acquire(blocking=False):
            raise BenchError(f"redis-py Lock: free lock {name} not acquired")
        lock.release()  # raises LockNotOwnedError if it was not ours

    return cycle


def python_redis_lock_cycle(setup: EngineSetup, name: str) -> Call:
    import redis_lock  # type: ignore[import-untyped]

    client, expire = setup.client, max(1, int(setup.ttl))

    def cycle(_: int) -> None:
        lock = redis_lock.Lock(client, name, expire=expire)
        if not lock.acquire(blocking=False):
            raise BenchError(f"python-redis-lock: free lock {name} not acquired")
        lock.release()  # raises NotAcquired if it was not ours

    return cycle


def once_cycle(setup: EngineSetup, name: str) -> Call:
    """celery-once's Redis backend as ``QueueOnce`` calls it: at send, then at the end."""
    from celery_once.backends.redis import Redis  # type: ignore[import-untyped]

    # its constructor takes the one client per process it builds from a URL: give it ours
    backend = Redis.__new__(Redis)
    backend._redis, backend.blocking, backend.blocking_timeout = setup.client, False, 1
    timeout = max(1, int(setup.ttl))

    def cycle(_: int) -> None:
        backend.raise_or_lock(name, timeout)  # raises AlreadyQueued if held
        backend.clear_lock(name)

    return cycle


def singleton_cycle(setup: EngineSetup, name: str) -> Call:
    """celery-singleton's Redis backend as ``Singleton`` calls it: at send, then at the end."""
    from celery_singleton.backends.redis import RedisBackend  # type: ignore[import-untyped]

    backend = RedisBackend.__new__(RedisBackend)  # it builds its client from a URL: use ours
    backend.redis = setup.client
    expiry = max(1, int(setup.ttl))

    def cycle(_: int) -> None:
        if not backend.lock(name, "task-id", expiry=expiry):
            raise BenchError(f"celery-singleton: free lock {name} not acquired")
        backend.unlock(name)

    return cycle


# -- worker level: a no-op task whose lock is taken and released around the body ---------------


def noop(i: int) -> None:
    """The body of every contender's task."""


def plain_task(setup: WorkerSetup, name: str) -> Any:
    return setup.app.task(name=name)(noop)


class FloorLock:
    """The least a lock taken at run time can cost: ``SET key 1 NX PX`` before the body,
    waiting for its reply, and ``DEL key`` after it, sent without waiting (its reply is read
    before the next ``SET``). One kept connection, no token, no Lua, no renewal, no error
    handling: not a usable lock, only the yardstick for one (the solo worker is one thread).
    """

    def __init__(self, url: str, connection_class: type, prefix: str) -> None:
        self.pool = redis.ConnectionPool.from_url(url, connection_class=connection_class)
        self.prefix = prefix
        self.connection: Any = None
        self.unread = 0

    def acquire(self, arg: Any) -> None:
        if self.connection is None:
            self.connection = self.pool.get_connection()
        self.connection.send_command("SET", f"{self.prefix}:{arg}", "1", "NX", "PX", "30000")
        self.read_unread()
        if self.connection.read_response() is None:
            raise BenchError(f"floor lock {arg} was held")

    def release(self, arg: Any) -> None:
        self.connection.send_command("DEL", f"{self.prefix}:{arg}")
        self.unread += 1

    def read_unread(self) -> None:
        while self.unread:
            self.connection.read_response()
            self.unread -= 1

    def close(self) -> None:
        if self.connection is not None:
            self.read_unread()
        self.pool.disconnect()
        self.connection = None


def floor_task(setup: WorkerSetup, name: str) -> Any:
    floor = FloorLock(setup.url, setup.connection_class, f"{setup.prefix}-floor")
    setup.closers.append(floor.close)

    class FloorTask(Task):  # type: ignore[misc]
        def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
            floor.acquire(args[0])

        def after_return(self, status: str, retval: Any, task_id: str, *args: Any) -> None:
            floor.release(args[0][0])

    return setup.app.task(name=name, base=FloorTask)(noop)


def locked_task(setup: WorkerSetup, name: str, **options: Any) -> Any:
    """``LockedTask`` with the plugin's own client (one per app: pick one such contender)."""
    # the plugin passes these to redis.Redis.from_url
    setup.app.conf.singleton_lock_redis_options = {"connection_class": setup.connection_class}
    setup.closers.append(partial(forget_locker, setup.app))
    return setup.app.task(name=name, base=LockedTask, **options)(noop)


class PooledLocker(RedisLocker):
    """Acquire and release through the client itself: one pool checkout per command, no
    kept connection (everything through redis-py's public API). A task's prepared acquire is
    the general one, so that it goes through ``_run`` too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        run = self.server.run

        def pooled(script: Any, key: str, keys: Any, args: Any, *, pinned: bool = False) -> Any:
            return run(script, key, keys, args, pinned=False)

        self.server.run = pooled  # type: ignore[method-assign]

    def prepare(self, request: Any) -> Any:
        check(request, self.capabilities, self.prefix)
        return GeneralAcquire(self, request)


class FStringKeyer(ArgumentKeyer):
    """The lock name as an f-string of the positional arguments: no binding, encoding or
    hash, so it against ``locked`` is what the canonical lock name costs per task. Not a
    usable lock name (``str()``-based, keyword arguments ignored); enough for ``noop(i)``."""

    def name(self, args: Optional[Sequence[Any]], kwargs: Optional[Any]) -> str:
        return f"{self.task_name}:{args}"


def variant_task(locker_class: type, keyer_class: Optional[type] = None) -> WorkerBuild:
    """A bench-only ``LockedTask`` subclass (the package is not changed) whose locker is a
    ``locker_class`` with a counting client of its own, made as the plugin makes its locker;
    with ``keyer_class``, its keyer is made one (an ``ArgumentKeyer`` subclass)."""

    def build(setup: WorkerSetup, name: str) -> Any:
        options = {"connection_class": setup.connection_class}
        locker = locker_class(make_client(setup.url, options), prefix=f"{setup.prefix}-lock")
        setup.closers.append(locker.client.close)
        if locker.connections is not None:
            setup.closers.insert(0, locker.connections.close)

        class Variant(LockedTask):
            # a locker of its own, not the app's
            lock_locker = locker

            @classmethod
            def _resolve_options(cls, app: Any, task_name: str) -> Any:
                resolved = super()._resolve_options(app, task_name)
                if keyer_class is not None:
                    resolved.keyer.__class__ = keyer_class
                return resolved

        Variant.__name__ = Variant.__qualname__ = f"Bench{locker_class.__name__}Task"
        return setup.app.task(name=name, base=Variant)(noop)

    return build


def skipped_task(setup: WorkerSetup, name: str) -> Any:
    """``LockedTask`` with ``on_duplicate="skip"`` and one lock for all its calls
    (``lock_key``), held by the bench for the whole run: every call is a skipped duplicate, to
    set against ``locked``'s no-op run. A locker of its own under ``<prefix>-held`` (as
    ``locked2``), so the held key is none of ``locked``'s; results ignored, like the others'
    (the app's ``task_ignore_result``), and task events off (the in-process worker's
    default)."""
    options = {"connection_class": setup.connection_class}
    locker = RedisLocker(make_client(setup.url, options), prefix=f"{setup.prefix}-held")

    class Skipped(LockedTask):
        lock_locker = locker

    Skipped.__name__ = Skipped.__qualname__ = "BenchSkippedTask"
    task = setup.app.task(
        name=name, base=Skipped, on_duplicate="skip", lock_key=lambda *_, **__: "held"
    )(noop)
    lock_name = task.lock_options.keyer.name((0,), {})  # binds the task (no app finalize)
    lease = locker.try_acquire(lock_name, 3600, owner=Owner(task_id="bench-holder"), renew=False)
    if not isinstance(lease, Lease):
        raise BenchError(f"the skipped contender's lock {lock_name} is held already")
    setup.closers.append(locker.client.close)
    if locker.connections is not None:
        setup.closers.insert(0, locker.connections.close)
    setup.closers.insert(0, lease.release)
    return task


def metrics_task(setup: WorkerSetup, name: str) -> Any:
    """``LockedTask`` with the lock metrics on (singleton_lock_metrics), for this task only:
    a locker of its own (as ``locked2``), prometheus_client's multiprocess files in a
    temporary directory, and the metrics receivers connected with this task as their sender.
    Every contender's task then finds the lock signals with a receiver, so the others pay
    Celery's dispatch finding none of theirs (a dict look-up); this one pays the counting."""
    import os
    import shutil
    import tempfile

    from prometheus_client import values

    from celery_singleton_lock.celery.observe import metrics

    directory = tempfile.mkdtemp(prefix="bench-metrics-")
    os.environ[metrics.MULTIPROC_ENV] = directory
    values.ValueClass = values.MultiProcessValue()
    proxy = variant_task(RedisLocker)(setup, name)
    task = proxy._get_current_object() if hasattr(proxy, "_get_current_object") else proxy
    metrics.connect(sender=task)
    setup.closers.append(partial(metrics.tear_down, task))
    setup.closers.append(partial(shutil.rmtree, directory, ignore_errors=True))
    return proxy


def once_task(setup: WorkerSetup, name: str) -> Any:
    import celery_once.backends.redis as once_redis  # type: ignore[import-untyped]
    from celery_once import QueueOnce

    setup.app.conf.ONCE = {
        "backend": "celery_once.backends.Redis",
        "settings": {"url": setup.url, "default_timeout": 60},
    }
    # it keeps one client per process, built from its URL on first use: count that one
    once_redis.redis = None
    client = once_redis.get_redis({"url": setup.url})
    client.connection_pool.disconnect()
    client.connection_pool.connection_class = setup.connection_class

    def close() -> None:
        if once_redis.redis is not None:
            once_redis.redis.connection_pool.disconnect()
            once_redis.redis = None

    setup.closers.append(close)
    return setup.app.task(name=name, base=QueueOnce)(noop)


def singleton_task(setup: WorkerSetup, name: str) -> Any:
    import celery_singleton.backends as singleton_backends  # type: ignore[import-untyped]
    from celery_singleton import Singleton

    singleton_backends._backend = None  # it caches one backend per process
    setup.app.conf.singleton_backend_url = setup.url
    setup.app.conf.singleton_key_prefix = f"{setup.prefix}-singleton:"
    # celery-singleton passes these to redis.Redis.from_url
    setup.app.conf.singleton_backend_kwargs = {"connection_class": setup.connection_class}

    def close() -> None:
        backend = singleton_backends._backend
        if backend is not None:
            backend.redis.connection_pool.disconnect()
            singleton_backends._backend = None

    setup.closers.append(close)
    return setup.app.task(name=name, base=Singleton)(noop)


# -- PostgreSQL: the locks in a schema of the run's own (bench/postgres.py) ---------------------


def postgres_url() -> str:
    """The database of the PostgreSQL contenders: ``$CSL_POSTGRES_URL``, else the local one
    (``bench/postgres.py`` points it at a database of the run's own)."""
    return os.environ.get("CSL_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def pgbouncer_url() -> str:
    """The same database through PgBouncer: ``$CSL_PGBOUNCER_URL`` (``bench/postgres.py
    --pgbouncer`` points it at the run's own database)."""
    url = os.environ.get("CSL_PGBOUNCER_URL")
    if not url:
        raise BenchError("no PgBouncer: run python -m bench postgres --pgbouncer URL")
    return url


def postgres_schema(prefix: str) -> str:
    """The schema of a run's lock tables: its bench prefix, as an identifier."""
    return prefix.replace("-", "_")


def postgres_locker(
    prefix: str, closers: List[Callable[[], None]], url: Optional[str] = None
) -> Any:
    """A ``PostgresLocker`` on the run's schema (created on first use, dropped at the end)
    with a renewer that runs no thread, as ``locked`` has; through ``url`` if given (PgBouncer
    in front of the same database), else to the database directly."""
    import psycopg

    from celery_singleton_lock.engine.postgres.locker import PostgresLocker

    schema = postgres_schema(prefix)
    url = url or postgres_url()
    separator = "&" if "?" in url else "?"
    locker = PostgresLocker(
        f"{url}{separator}schema={schema}",
        prefix=f"{prefix}-pg",
        renewer=Renewer(autostart=False),
    )

    def drop() -> None:
        locker.close()
        with psycopg.connect(postgres_url(), autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")

    closers.append(drop)
    return locker


def postgres_cycle(setup: EngineSetup, name: str) -> Call:
    """``PostgresLocker.try_acquire`` then ``release`` (renew=False): 2 statements."""
    locker = postgres_locker(setup.prefix, setup.closers)
    return lease_cycle(locker, name, setup.ttl, renew=False)


def pgbouncer_cycle(setup: EngineSetup, name: str) -> Call:
    """``postgres_cycle`` through PgBouncer in transaction mode (its own schema)."""
    locker = postgres_locker(f"{setup.prefix}-pgb", setup.closers, pgbouncer_url())
    return lease_cycle(locker, name, setup.ttl, renew=False)


def postgres_floor_cycle(setup: EngineSetup, name: str) -> Call:
    """The least a row lease can do: ``INSERT ... ON CONFLICT DO NOTHING`` of a row then its
    ``DELETE``, autocommit, on one kept connection, no token check, expiry or fence. The table
    is made and dropped by connections of their own (the kept one runs the cycles only)."""
    import psycopg

    schema = postgres_schema(setup.prefix)
    with psycopg.connect(postgres_url(), autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        admin.execute(
            f"CREATE TABLE IF NOT EXISTS {schema}.floor (name text PRIMARY KEY, token text, "
            "lease_until timestamptz)"
        )
    connection = psycopg.connect(postgres_url(), autocommit=True, prepare_threshold=None)
    insert = (
        f"INSERT INTO {schema}.floor VALUES (%s, %s, now() + interval '30 seconds') "
        "ON CONFLICT DO NOTHING"
    )
    delete = f"DELETE FROM {schema}.floor WHERE name = %s"
    token_hex = secrets.token_hex

    def cycle(_: int) -> None:
        if connection.execute(insert, (name, token_hex(16))).rowcount != 1:
            raise BenchError(f"postgres floor: free row {name} not inserted")
        connection.execute(delete, (name,))

    def drop() -> None:
        with psycopg.connect(postgres_url(), autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")

    setup.closers.extend([connection.close, drop])
    return cycle


def postgres_task(setup: WorkerSetup, name: str) -> Any:
    """``LockedTask`` whose locks are PostgreSQL row leases (a locker of its own, on the run's
    schema); the broker is the bench's Redis, as for every contender."""
    locker = postgres_locker(setup.prefix, setup.closers)

    class OnPostgres(LockedTask):
        lock_locker = locker

    OnPostgres.__name__ = OnPostgres.__qualname__ = "BenchPostgresTask"
    return setup.app.task(name=name, base=OnPostgres)(noop)


def pgbouncer_task(setup: WorkerSetup, name: str) -> Any:
    """``postgres_task`` with its locks through PgBouncer in transaction mode."""
    locker = postgres_locker(f"{setup.prefix}-pgb", setup.closers, pgbouncer_url())

    class ThroughPgBouncer(LockedTask):
        lock_locker = locker

    ThroughPgBouncer.__name__ = ThroughPgBouncer.__qualname__ = "BenchPgBouncerTask"
    return setup.app.task(name=name, base=ThroughPgBouncer)(noop)
