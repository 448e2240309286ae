"""``locks doctor`` on a Sentinel group and a Redis Cluster (real processes on 127.0.0.1): what
each says of itself, and the eviction policy of every primary."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from celery import Celery

from celery_singleton_lock.celery.cli.app_target import open_target
from celery_singleton_lock.celery.cli.doctor import Finding, run_doctor
from tests.cluster_topology import ClusterGroup
from tests.sentinel_topology import SentinelGroup


def doctor_findings(app: Celery) -> list[Finding]:
    target = open_target(app=app)
    try:
        return run_doctor(target, app, ping_timeout=0.5)
    finally:
        target.close()


def problems(findings: list[Finding], check: str) -> list[Finding]:
    return [f for f in findings if f.check == check and f.unhealthy]


def lock_app(url: str, **settings: Any) -> Celery:
    app = Celery("doctor-topology", broker="memory://", set_as_current=False)
    app.conf.update(singleton_lock_url=url, **settings)
    return app


@pytest.fixture(scope="module")
def sentinels() -> Iterator[SentinelGroup]:
    with SentinelGroup.running() as group:
        yield group


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterGroup]:
    with ClusterGroup.running() as group:
        yield group


def test_doctor_finds_nothing_wrong_with_a_healthy_sentinel_group(
    sentinels: SentinelGroup,
) -> None:
    app = lock_app(sentinels.url, singleton_lock_transport_options=sentinels.transport_options)
    assert problems(doctor_findings(app), "sentinel") == []


def test_doctor_says_a_sentinel_that_does_not_answer(sentinels: SentinelGroup) -> None:
    app = lock_app(
        sentinels.url + ";sentinel://127.0.0.1:1/0",
        singleton_lock_transport_options=sentinels.transport_options,
    )
    (finding,) = problems(doctor_findings(app), "sentinel")
    assert "sentinel 127.0.0.1:1" in finding.message


def test_doctor_finds_nothing_wrong_with_a_healthy_cluster(cluster: ClusterGroup) -> None:
    assert problems(doctor_findings(lock_app(cluster.url)), "cluster") == []


def test_doctor_names_the_cluster_primary_that_may_evict_any_key(cluster: ClusterGroup) -> None:
    port = cluster.primary_ports()[1]
    node = cluster.node(port)
    node.config_set("maxmemory-policy", "allkeys-lru")
    try:
        (finding,) = problems(doctor_findings(lock_app(cluster.url)), "eviction")
    finally:
        node.config_set("maxmemory-policy", "noeviction")
        node.close()
    assert (finding.severity, f"cluster primary 127.0.0.1:{port}" in finding.message) == (
        "error",
        True,
    )
