"""The reads of the parts a backend does not have (parked calls, latest wins, rates, queued
markers), written once for every reader of such a backend (:mod:`.quorum_reading`,
:mod:`.postgres.reading`), which assigns them as its methods (as ``checks.try_acquire`` is
assigned): each answers "none", which is true there, since none can be made."""

from __future__ import annotations

from typing import Any, Iterator, Optional


def no_waiting_newest(reader: Any, name: str) -> Optional[tuple[str, Optional[float]]]:
    """None: nothing waits (``replace`` is refused)."""
    return None


def nothing_parked(reader: Any, name: str) -> list[str]:
    """None: nothing is parked (``on_duplicate='queue'`` is refused)."""
    return []


def no_parked_counts(reader: Any, lock_keys: list[str]) -> list[int]:
    """Zeros: nothing is parked."""
    return [0] * len(lock_keys)


def no_parked_locks(reader: Any, limit: int = 10_000) -> list[tuple[str, int, bool]]:
    """None: nothing is parked."""
    return []


def no_shared_counts(reader: Any) -> Optional[tuple[int, int]]:
    """None: not counted here."""
    return None


def no_rate_use(reader: Any, lock_keys: list[str]) -> list[tuple[int, Optional[float]]]:
    """No starts: ``lock_rate`` is refused."""
    return [(0, None)] * len(lock_keys)


def no_queued_names(reader: Any, count: int = 500) -> Iterator[str]:
    """None: no queued marker is ever written."""
    return iter(())


no_marker_keys = no_queued_names
