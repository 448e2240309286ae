"""``kill -9`` of prefork pool children running a body, across policies ``queue``, ``retry``
and ``skip`` (issue 19, part 1; see tests/chaos/kill_soak.py): no call whose body ended waits
more than 5 s for its outcome, none is lost, none runs twice, no two bodies of a key overlap.

About 50 kills by default; 1,000 with ``--full``. ``CSL_CHAOS_SEED`` replays a seed.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from tests.chaos import kill_soak
from tests.chaos.test_faults import SEED, full


@pytest.mark.parametrize("size", full(pytest.mark.timeout(1200)))
def test_child_kills_leave_no_call_hung_lost_doubled_or_overlapping(
    size: str, chaos_figures: Callable[[dict[str, Any]], None]
) -> None:
    wanted = kill_soak.FULL if size == "full" else kill_soak.REDUCED
    with kill_soak.soak_servers() as servers:
        figures = kill_soak.run(servers, wanted, SEED)
    chaos_figures(figures.as_dict())
    assert figures.kills == wanted.kills
    assert all(figures.calls_by_policy.get(policy) for policy in kill_soak.POLICIES)
    assert (figures.hung, figures.lost, figures.doubled, figures.overlaps) == (0, 0, 0, 0)
