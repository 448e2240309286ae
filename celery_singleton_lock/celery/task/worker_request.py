"""The worker-side request of a locked task: Celery's own, plus the content type of its message
and when the worker received it.

Celery's tracer decodes a message with its content type but keeps none of it in the task's
``self.request`` (the ``Context``): a call the lock layer sends again (a lock retry, a parked
call handed on, a joiner's retry) would go out with the task's default serializer, and a call
sent with ``serializer="pickle"`` whose arguments JSON cannot hold failed with ``EncodeError``
on its re-send. The request dict built here, in the process that received the message, is the
one Celery hands to the pool (a prefork child included) and turns into ``self.request``; one
more field in it carries the content type to every re-send (:func:`.celery_api.serializer_of`).

A second field carries the wall-clock time the worker's main process built this request, i.e.
had the message (or its ETA, if later: a call scheduled for later is not waiting for its lock
before then). ``celery_lock_acquire_seconds`` measures from it, so the time a call spent in the
worker's own buffer behind busy pool processes counts as part of its wait
(:mod:`.observe.timing`). One ``time.time()`` and one dict entry per message, with or without
metrics: no receiver, no signal.

Loaded by the worker only, by name (``LockedTask.Request``), so a producer never imports
Celery's worker modules.
"""

from __future__ import annotations

import time
from typing import Any

from celery.worker.request import Request

from celery_singleton_lock.celery.celery_api import CONTENT_TYPE_FIELD, RECEIVED_FIELD


class LockedRequest(Request):  # type: ignore[misc]
    """Celery's ``Request``, with the message's content type and receipt time in the request
    dict."""

    def __init__(self, message: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(message, *args, **kwargs)
        received = time.time()
        eta = self.eta  # an aware datetime (Celery parsed it above), or None
        if eta is not None:
            received = max(received, eta.timestamp())
        self._request_dict[RECEIVED_FIELD] = received
        content_type = self._content_type  # None for a message Celery decoded itself (proto 1)
        if content_type:
            self._request_dict[CONTENT_TYPE_FIELD] = content_type
