"""The kinds of lock of one Redis server, one small class each, each owning its scripts and
running them through the server it holds (:class:`~..redis_server.RedisServer`):
:mod:`.mutex`, :mod:`.slots`, :mod:`.cooldown`, :mod:`.slot_queue` (policy ``queue``),
:mod:`.latest` (latest wins), :mod:`.cancels` (``restart``'s cancel flags) and :mod:`.markers`
(``dedupe_on_enqueue``); what they share, the leases handed out and taken back, is
:mod:`..server_leases`. :class:`~..locker.RedisLocker` composes them.
"""
