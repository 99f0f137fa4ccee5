"""The base of every ledger admin: read-only history, a paginator whose count stops at
COUNT_CAP (ledger.webkit.paging), newest first by primary key, links between admins.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from ledger.webkit.paging import CappedCountPaginator


class LedgerAdmin(admin.ModelAdmin):
    paginator = CappedCountPaginator
    show_full_result_count = False
    list_per_page = 50
    # Ledger ids sort by creation time: newest first without sorting the table.
    ordering = ("-id",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Who may run lifecycle actions: users holding the model's change permission.

        The admin never edits rows (has_change_permission is False for everyone), so the
        Django permission is free to mean "may operate": superusers, and staff granted it.
        """
        opts = self.model._meta
        return request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}")


def admin_link(obj: Any, label: str | None = None) -> str:
    """A link to obj's admin change page ('-' when obj is None)."""
    if obj is None:
        return "-"
    url = reverse(
        f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk]
    )
    return format_html('<a href="{}">{}</a>', url, label or str(obj))


def changelist_link(model: type[Model], label: str, **params: str) -> str:
    """A link to a changelist filtered by `params` (one-part lookups the admin allows)."""
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    return format_html('<a href="{}?{}">{}</a>', url, urlencode(params), label)
