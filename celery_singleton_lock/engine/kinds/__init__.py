"""The kinds of lock of one Redis server, one small class each, each owning its scripts and
running them through the server it holds (:class:`~..redis_server.RedisServer`):
:mod:`.mutex`, :mod:`.slots`, :mod:`.cooldown`, :mod:`.parking` (policy ``queue``),
:mod:`.slot_queue`, :mod:`.latest` (latest wins), :mod:`.cancels` (``restart``'s cancel flags)
and :mod:`.markers` (``dedupe_on_enqueue``).
:class:`~..locker.RedisLocker` composes them.
"""
