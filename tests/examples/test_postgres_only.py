"""The no-Redis example (``python -m examples.postgres_only``) on real workers: RabbitMQ as
the broker, PostgreSQL for the locks and the data, no Redis URL given to anything."""

from __future__ import annotations

import contextlib
import socket

import pytest

from tests.examples.test_examples import run_example
from tests.postgres_support import BASE_URL


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 2):
        return True
    return False


pytestmark = [
    pytest.mark.skipif(not _answers(5672), reason="no RabbitMQ at 127.0.0.1:5672"),
    pytest.mark.skipif(not _answers(5432), reason="no PostgreSQL at 127.0.0.1:5432"),
]


@pytest.mark.timeout(240)
def test_fenced_updates_exact_and_report_never_overlaps_with_no_redis() -> None:
    pytest.importorskip("psycopg")
    code, report, output = run_example(
        "examples.postgres_only",
        "--accounts",
        "3",
        "--updates",
        "40",
        "--seed",
        "11",
        "--database-url",
        BASE_URL,
        timeout=200,
    )
    assert code == 0, output
    assert "redis://" not in output, output
    assert report["exact"] is True and report["applied"] == 40, output  # each update once
    assert report["wrong_accounts"] == 0, output
    assert report["fences_in_order"] is True, output  # fences grow in applied order
    assert report["report_overlaps"] == 0, output  # the skip job never ran twice at once
    assert report["report_runs"] >= 1 and report["skipped"] >= 1, output
