"""The locks in the Django admin: add ``"celery_singleton_lock.contrib.django"`` to
``INSTALLED_APPS`` (extra ``[django]``).

Staff with the ``view_lock`` permission (or superusers) see the locks held now (with their
slots, cooldowns and rate windows), the calls parked behind them and the queued markers; those
with ``release_lock`` release a lock whose holder is gone, by POST with Django's CSRF check,
as ``celery locks release`` does. The Celery app is the setting ``CELERY_SINGLETON_LOCK_APP``
(``"proj.celery:app"``), else Celery's current app.

Nothing else in the package imports Django: this is an edge, like ``compat.py``, that reads
through the Celery layer's commands (``celery/cli``).
"""
