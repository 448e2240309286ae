"""The Django app's configuration: its label names the permissions
(``celery_singleton_lock.release_lock``)."""

from __future__ import annotations

from django.apps import AppConfig


class SingletonLockConfig(AppConfig):  # type: ignore[misc]  # Django ships no types
    name = "celery_singleton_lock.contrib.django"
    label = "celery_singleton_lock"
    verbose_name = "Celery singleton locks"
    # the one model has no table; saying its key type spares the project a warning (W042)
    default_auto_field = "django.db.models.AutoField"
