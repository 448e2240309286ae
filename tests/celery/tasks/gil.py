"""A body that holds the GIL, as a C extension's long call does
(tests/celery/test_gil_starvation.py, test_supervisor.py)."""

from __future__ import annotations

import re
import time
from typing import Any

from celery_singleton_lock import LockedTask
from tests.celery.tasks.core import app, inside

#: Never matches "a" * n + "b"; the regex engine backtracks for a time growing ~1.6x per "a",
#: all in one C call that keeps the GIL.
GIL_PATTERN = r"(a|aa)+$"


@app.task(bind=True, base=LockedTask, lock_on=("key",), lock_ttl=1, on_duplicate="skip")
def holds_the_gil(self: LockedTask, key: str, size: int = 0) -> dict[str, Any]:
    """Records itself as :func:`~tests.celery.tasks.core.body` does, holding the GIL for one
    regex match in between."""
    with inside(key, self.request.id):
        started = time.monotonic()
        re.match(GIL_PATTERN, "a" * size + "b")
    return {"held_gil_s": time.monotonic() - started}
