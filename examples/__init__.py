"""Runnable examples of celery-singleton-lock (``python -m examples.demo`` runs them all).

* ``examples.beat_singleton``: two ``celery beat`` processes fire a 5 s job every 2 s; the
  lock makes sure it never runs twice at once (duplicates are skipped and logged).
* ``examples.balances``: concurrent read-modify-write updates of account balances in a real
  database, with per-account locks and fencing tokens, next to the same workload without them.

They use only the public API of the package; ``examples.common`` holds the process and
configuration plumbing they share.
"""
