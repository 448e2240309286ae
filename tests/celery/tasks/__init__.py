"""The tasks the Celery-layer tests run, one module a job, all on one app (:mod:`.core`).

``tests.celery.lockapp`` imports every module here: it is the app the in-process worker serves
and the subprocess workers load (``celery -A tests.celery.lockapp``). A test imports the
module of its tasks; a task's name is its module's (``tests.celery.tasks.policies.hold_skip``).

- :mod:`.core`: the app, its configuration, the bodies' records (``store``, ``body``,
  ``keyed_task``, the gates);
- :mod:`.policies`: skip, retry, wait, fail; :mod:`.queueing`: ``on_duplicate="queue"``;
  :mod:`.join`: ``on_duplicate="join"``; :mod:`.dedupe`: ``dedupe_on_enqueue``;
  :mod:`.limits`: ``lock_limit``, ``lock_rate``, ``lock_cooldown``;
  :mod:`.models`: pydantic models as arguments (``pydantic=True``); :mod:`.restart`:
  ``on_duplicate="restart"``; :mod:`.pausing`: ``celery locks pause``, ``pause_for``;
- :mod:`.compat`: the ``QueueOnce`` / ``Singleton`` drop-ins;
- :mod:`.runtime`: what a body sees of its lock, acquires the server cannot grant;
  :mod:`.scope`: every path after the acquire releases; :mod:`.exits`: every way a task ends;
  :mod:`.adapter`: what ``celery_api`` reads from a request; :mod:`.canvas`: plain canvas
  callbacks;
- :mod:`.expiry`: short TTLs and late acks for killed workers; :mod:`.gil`: a body that holds
  the GIL; :mod:`.chaos`: the chaos suite's fenced balance updates.
"""
