"""Waiting for a lock to be released: a subscription to its release channel.

Every release (and every reclaim of a dead holder's lock) publishes the lock key on
``<lock key>:released`` in the same script that deletes it, when anyone is subscribed there
(lua/includes/announce.lua): a waiter subscribes before it reads the lock again.
"""

from __future__ import annotations

import time
from functools import partial

import redis

from celery_singleton_lock.engine import server_errors


def subscribe_releases(client: redis.Redis, channel: str) -> redis.client.PubSub:
    """A subscription to the release ``channel`` of a lock (the caller closes it)."""
    pubsub: redis.client.PubSub = client.pubsub(  # type: ignore[no-untyped-call]
        ignore_subscribe_messages=True
    )
    server_errors.call(lambda: pubsub.subscribe(channel), channel)
    return pubsub


def wait_for_release(pubsub: redis.client.PubSub, timeout: float) -> bool:
    """Block until a release is published on ``pubsub`` or ``timeout`` passes.

    Returns True when woken by a release. A crashed holder publishes nothing, so callers bound
    ``timeout`` by the holder's remaining TTL.
    """
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        message = server_errors.call(partial(pubsub.get_message, False, remaining), "pubsub")
        if message is not None and message.get("type") == "message":
            return True
