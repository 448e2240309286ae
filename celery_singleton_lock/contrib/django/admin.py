"""The admin's page of locks (``admin/celery_singleton_lock/lock/``) and its release URL.

Both go through ``AdminSite.admin_view``: an anonymous or non-staff user is sent to the
admin's login page, and every POST is checked by Django's CSRF middleware's rules
(``csrf_protect``). Seeing the page takes ``celery_singleton_lock.view_lock``, releasing
``celery_singleton_lock.release_lock`` (a superuser has both). A release is a POST only: any
other method is answered 405 and changes nothing.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from celery_singleton_lock.contrib.django.lock_server import (
    lock_app,
    open_lock_server,
    ping_timeout,
)
from celery_singleton_lock.contrib.django.models import Lock
from celery_singleton_lock.contrib.django.overview import read_overview
from celery_singleton_lock.contrib.django.releasing import release_from_page
from celery_singleton_lock.errors import LockError

TEMPLATE = "admin/celery_singleton_lock/locks.html"


@admin.register(Lock)
class LockAdmin(admin.ModelAdmin):  # type: ignore[misc]  # Django ships no types
    """The locks page in place of a change list; nothing is added, changed or deleted."""

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_release_permission(self, request: Any) -> bool:
        return bool(request.user.has_perm(f"{self.opts.app_label}.release_lock"))

    def get_urls(self) -> list[Any]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        return [
            path("", wrap(self.locks_view), name=f"{prefix}_changelist"),
            path("release/", wrap(self.release_view), name=f"{prefix}_release"),
        ]

    def locks_view(self, request: Any) -> Any:
        """The page: the locks held now, the calls parked behind them, the queued markers."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Locks held now",
            "can_release": self.has_release_permission(request),
            "release_url": reverse(
                f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_release"
            ),
        }
        try:
            app = lock_app()
            target = open_lock_server(app)
            try:
                context["overview"] = read_overview(target, app, ping_timeout())
            finally:
                target.close()
        except LockError as exc:  # a server down, a bad setting: said on the page
            context["error"] = str(exc)
        return TemplateResponse(request, TEMPLATE, context)

    def release_view(self, request: Any) -> Any:
        """Release one key (a POST from the page); back to the page, which says what it did."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_release_permission(request):
            raise PermissionDenied
        key = request.POST.get("key", "")
        task_id = request.POST.get("task_id", "")
        try:
            app = lock_app()
            target = open_lock_server(app)
        except LockError as exc:
            messages.error(request, str(exc))
        else:
            try:
                outcome = release_from_page(
                    target,
                    app,
                    key,
                    task_id,
                    force=request.POST.get("force") == "yes",
                    ping_timeout=ping_timeout(),
                )
            finally:
                target.close()
            (messages.success if outcome.released else messages.error)(request, outcome.message)
        page = reverse(
            f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_changelist"
        )
        return HttpResponseRedirect(page)
