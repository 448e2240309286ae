"""``kill -9`` of whole workers on the PostgreSQL lock server (issue 34's acceptance, repeated):
RabbitMQ as the broker, locks in PostgreSQL, no Redis URL anywhere (tests/celery/postgresapp.py).

Each round, a task holding its lock (``lock_ttl=3``) runs a 300 s body when its whole worker
(main process and pool) gets ``SIGKILL``; a duplicate is sent at once, for the workers left (one
more than the rounds, all started together at first: no round waits for a new one). The dead
holder's row keeps its lease to ``lease_until`` (the database's clock): the duplicate may start
only once that ran out, and must within ``lock_ttl`` + 3 s.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import pytest

from tests.celery.pg_workers import APP, Setup, rabbitmq_answers
from tests.celery.test_postgres_workers import setup  # noqa: F401 - the fixture
from tests.celery.workers import CeleryWorkerProcess, unique, worker_group
from tests.support import wait_until

TTL = 3.0  # pg_long's lock_ttl
ROUNDS = int(os.environ.get("CSL_PG_KILL_ROUNDS", "3"))


pytestmark = pytest.mark.skipif(not rabbitmq_answers(), reason="no RabbitMQ at 127.0.0.1:5672")


@pytest.mark.timeout(600)
def test_kill_9_of_the_holders_worker_frees_its_lock_after_the_lease_and_within_ttl_plus_3s(
    setup: Setup,  # noqa: F811 - the fixture
    chaos_figures: Callable[[dict[str, Any]], None],
) -> None:
    queue = setup.queue()
    delays: list[float] = []
    with worker_group(setup.servers) as group:
        workers = group.start(ROUNDS + 1, queue=queue, concurrency=2, app=APP)
        for _ in range(ROUNDS):
            key = unique("kill")
            setup.client.send_task(f"{APP}.pg_long", args=[key, 0, 300.0], queue=queue)
            first = wait_until(lambda k=key: setup.rows(k), timeout=60)[0]
            holder: CeleryWorkerProcess = next(w for w in workers if first[1] in w.children())
            holder.crash()
            killed = setup.now()
            setup.client.send_task(f"{APP}.pg_long", args=[key, 1, 0.1], queue=queue)
            rows = wait_until(
                lambda k=key: (lambda r: r if len(r) == 2 else None)(setup.rows(k)), 60
            )
            delays.append((rows[1][3] - killed).total_seconds())
            workers.remove(holder)
    chaos_figures(
        {
            "backend": "postgresql",
            "kills": len(delays),
            "lock_ttl_s": TTL,
            "duplicate_after_kill_s": [round(d, 2) for d in delays],
            "max_s": round(max(delays), 2),
        }
    )
    # the duplicate waited for the dead holder's lease (renewed every lock_ttl / 3 at most)...
    assert min(delays) >= TTL / 2, delays
    # ...and ran within lock_ttl + 3 s of the kill
    assert max(delays) <= TTL + 3, delays
