"""Compact cells for the admin's lists and pages and /ops/: short ids (full id on hover),
coloured statuses, seconds, ages, project basenames, task titles, and the sentence that says
where a work item stands now.

Pure functions of their arguments (no queries): the changelists stay at a fixed query count.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils.html import format_html
from django.utils.safestring import SafeString

from ledger.display import duration_text
from ledger.display import seconds as seconds  # shared with the runner's messages

# Status -> badge colour class (templates/admin/ledger/_styles.html holds the colours).
STATUS_TONES = {
    "queued": "wait",
    "deferred": "wait",
    "pending": "wait",
    "admitted": "live",
    "running": "live",
    "succeeded": "ok",
    "skipped": "quiet",
    "failed": "bad",
    "timed_out": "bad",
    "dead_letter": "bad",
    "cancelled": "quiet",
    "archived": "quiet",
    "active": "live",
    "paused": "wait",
    "stopped": "quiet",
}


def short_id(value: str | None) -> SafeString | str:
    """The last 8 characters (ids start with their creation time, so the end tells rows
    apart), with the full id on hover."""
    if not value:
        return "-"
    return format_html('<span class="lw-id" title="{}">…{}</span>', value, value[-8:])


def status_badge(status: str | None) -> SafeString | str:
    if not status:
        return "-"
    tone = STATUS_TONES.get(status, "quiet")
    return format_html('<span class="lw-status lw-{}">{}</span>', tone, status)


def age(value: datetime | None, now: datetime) -> str:
    """How long ago, as /ops/ says it (ledger.display.duration_text): `45 s`, `12 min 5 s`,
    `3 h`, `5 d 2 h`; blank when unknown."""
    if value is None:
        return ""
    return duration_text((now - value).total_seconds())


def project_basename(path: str | None) -> SafeString | str:
    if not path:
        return "-"
    base = path.rstrip("/").rsplit("/", 1)[-1] or path
    return format_html('<span title="{}">{}</span>', path, base)


def task_title(subject_json: Any, fallback: str) -> str:
    """The task's title (todos tasks) or the event's message (generic), else `fallback`."""
    raw = subject_json.get("raw") if isinstance(subject_json, dict) else None
    if isinstance(raw, dict):
        for key in ("title", "message"):
            text = raw.get(key)
            if isinstance(text, str) and text.strip():
                return text.strip()
    return fallback


def task_description(subject_json: Any) -> str:
    raw = subject_json.get("raw") if isinstance(subject_json, dict) else None
    if isinstance(raw, dict):
        text = raw.get("description") or raw.get("message")
        if isinstance(text, str):
            return text
    return ""


def current_state(
    *,
    status: str,
    last_reason: str | None,
    run_id: str | None,
    run_status: str | None,
    run_finished_at: datetime | None,
    run_error: str | None,
) -> str:
    """One sentence for where an item stands now.

    `last_reason` is upstream's reason trail: a success keeps the admission's reason
    ("admitted by todos-task route"), which reads as if the item were still waiting. A
    finished item is described by its run instead; a live one by its last reason.
    """
    run = f"run …{run_id[-8:]}" if run_id else "its run"
    when = f" at {run_finished_at:%Y-%m-%d %H:%M:%S} UTC" if run_finished_at else ""
    if status == "succeeded":
        return f"succeeded: {run} finished{when}"
    if status in ("failed", "timed_out"):
        detail = run_error or last_reason
        return f"failed: {run} {run_status or 'failed'}{when}" + (
            f" ({detail})" if detail else ""
        )
    if status == "running":
        return f"running: {run} is running"
    if status == "admitted":
        return f"admitted: {run} waits for a worker" + (
            f" ({last_reason})" if last_reason else ""
        )
    return f"{status}: {last_reason}" if last_reason else status
