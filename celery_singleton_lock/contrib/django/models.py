"""The admin's page of locks hangs on a model, as every admin page does: one with no table
(``managed = False``, so no migration) whose only use is its place in the admin's index and
the two permissions Django makes for it after ``migrate``: ``view_lock`` (see the page) and
``release_lock`` (release from it)."""

from __future__ import annotations

from django.db import models


class Lock(models.Model):  # type: ignore[misc]  # Django ships no types
    """A lock held on the lock server; never stored (the page reads the server)."""

    class Meta:
        managed = False
        verbose_name = "lock"
        verbose_name_plural = "locks"
        default_permissions = ("view",)
        permissions = [("release_lock", "Can release a lock whose holder is gone")]
