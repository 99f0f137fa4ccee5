"""The audit trail of an operator's action, shared by the admin's lifecycle actions and
/ops/'s: one admin `LogEntry` per row it changed (who, when, the action and the reason)."""

from __future__ import annotations

from django.contrib.admin.models import CHANGE, LogEntry
from django.db.models import Model
from django.http import HttpRequest


def log_operator_action(
    request: HttpRequest, model: type[Model], pk: str, title: str, reason: str | None
) -> None:
    """One admin LogEntry for one row an operator action changed (the audit trail)."""
    obj = model._default_manager.filter(pk=pk).first()
    if obj is None:
        return
    assert request.user.pk is not None  # the admin's actions need a signed-in user
    LogEntry.objects.log_actions(
        user_id=request.user.pk,
        queryset=[obj],
        action_flag=CHANGE,
        change_message=f"{title}: {reason}" if reason else title,
        single_object=True,
    )
