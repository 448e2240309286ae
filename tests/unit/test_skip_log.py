"""A skip's WARNING, once per burst of skips of one key (celery/duplicates/skip_log.py)."""

from __future__ import annotations

import logging

import pytest

from celery_singleton_lock.celery.duplicates import skip_log
from celery_singleton_lock.celery.duplicates.skip_log import SkipLog

LOGGER = "celery_singleton_lock.duplicate"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def skips(clock: Clock) -> SkipLog:
    return SkipLog(logging.getLogger(LOGGER), burst_seconds=10.0, clock=clock)


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_a_burst_of_skips_of_one_key_logs_one_warning(
    skips: SkipLog, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, LOGGER):
        for n in range(50):
            skips.skipped("k", f"skip {n}")
    assert lines(caplog) == ["skip 0"]


def test_the_first_skip_after_a_burst_says_how_many_were_left_out(
    skips: SkipLog, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, LOGGER):
        for n in range(5):
            skips.skipped("k", f"skip {n}")
        clock.now += 10.0
        skips.skipped("k", "skip 5")
    assert lines(caplog) == [
        "skip 0",
        "skip 5 (and 4 more skips of this key not logged since its previous line)",
    ]


def test_skips_of_another_key_are_logged_apart(
    skips: SkipLog, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, LOGGER):
        skips.skipped("k", "skip of k")
        skips.skipped("other", "skip of other")
    assert lines(caplog) == ["skip of k", "skip of other"]


def test_the_keys_tracked_stay_bounded(
    skips: SkipLog, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(skip_log, "MAX_KEYS", 8)
    for n in range(100):
        clock.now += 1.0
        skips.skipped(f"k{n}", "skip")
    assert len(skips._bursts) <= 8
