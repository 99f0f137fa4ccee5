"""Template filters of the /ops pages (thin wrappers over routing.ops.display)."""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString

from agents import agent_output
from ledger.display import commit_text, worktree_text
from ledger.models import WorkflowRun, WorkflowWorkItem
from ledger.services import CANCELLABLE_STATUSES, REQUEUEABLE_STATUSES
from ledger.webkit import cells as web_cells
from routing.ops import display as ops_display

register = template.Library()


@register.filter
def when(value: datetime | None, now: datetime) -> SafeString | str:
    """A UTC time with its relative age: `2026-11-29 16:40:03 UTC (3 min ago)`.

    `now` comes from the view, so every time on a page is measured from the same instant.
    """
    if value is None:
        return "—"
    return format_html(
        '<time datetime="{}">{}</time> <span class="ago">({})</span>',
        value.isoformat(),
        ops_display.utc_text(value),
        ops_display.relative_age(value, now),
    )


@register.filter
def ago(value: datetime | None, now: datetime) -> str:
    return ops_display.relative_age(value, now)


@register.filter
def reason_label(code: str | None) -> str:
    return ops_display.reason_label(code)


@register.filter
def elapsed(value: datetime | None, now: datetime) -> str:
    """How long since `value`: `42 s`, `5 min 3 s`, `2 h 10 min`."""
    return ops_display.elapsed(value, now)


@register.filter
def seconds(ms: int | None) -> str:
    """A duration in milliseconds as the admin shows it: `0.4 s`, `12 min 34 s`."""
    return "—" if ms is None else web_cells.seconds(ms)


@register.filter
def worktree(run: WorkflowRun) -> str:
    """The run's git worktree, branch and what became of it (`-` when it had none)."""
    return worktree_text(run)


@register.filter
def work_left(run: WorkflowRun) -> str:
    """What the run left on its branch and how to check it out (`-` when nothing yet)."""
    return commit_text(run)


# Who may retry or cancel an item from a page: staff holding the item's change permission.
ITEM_ACTION_PERMISSION = "ledger.change_workflowworkitem"


@register.inclusion_tag("ops/_item_actions.html", takes_context=True)
def item_actions(context: template.Context, item: WorkflowWorkItem | None) -> dict:
    """The Retry / Cancel buttons of one work item (POST to ops:item-action, CSRF), shown
    to staff with the change permission when the item's status allows the action; back to
    the page they were pressed on."""
    request = context.get("request")
    user = getattr(request, "user", None)
    allowed = bool(
        item is not None
        and user is not None
        and user.is_active
        and user.is_staff
        and user.has_perm(ITEM_ACTION_PERMISSION)
    )
    status = str(item.status) if item is not None and allowed else ""
    route = item.route_options_json if item is not None else None
    stored = route.get("options") if isinstance(route, dict) else None
    return {
        "item": item,
        # What Retry re-admits with (`--flag value` pairs); None: no stored route.
        "route_options": ops_display.options_text(stored)
        if isinstance(stored, dict)
        else None,
        "csrf_token": context.get("csrf_token"),
        "next": request.get_full_path() if request is not None else "",
        "retryable": status in {str(s) for s in REQUEUEABLE_STATUSES},
        "cancellable": status in {str(s) for s in CANCELLABLE_STATUSES},
    }


@register.filter
def reason_line(text: str | None) -> str:
    """A cooldown's or a step's reason as one human line: the provider's message out of
    the raw text the runner recorded (agents.agent_output.reason_line)."""
    return agent_output.reason_line(text)
