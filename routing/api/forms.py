"""Query-string validation for the JSON API (Django forms, one per endpoint).

Unknown parameters are refused rather than ignored: a typo in `max_active` or `status` must
not silently drop a cap or a filter.
"""

from __future__ import annotations

import os
import re
from typing import Any

from django import forms

from domain.errors import ApplicationError
from domain.keys import KINDS, ROUTE_KEYS, route_key_for_kind
from ledger.models import WorkItemStatus
from routing.admission import OPTION_NAMES, checked_route_options
from routing.api.serializers import cursor_decode

MAX_PAGE = 200
DEFAULT_PAGE = 50
# Route options the ingest endpoint takes from its query string. Dry runs are left out: the
# events are stored either way, so a dry-run admission would report on rows it keeps. Manual
# break-glass is an operator's decision (commands, schedules), never an ingest token's: an
# event producer cannot lift its own agents' sandbox.
INGEST_ROUTE_OPTIONS = tuple(
    name for name in OPTION_NAMES if name not in ("dry_run", "manual_break_glass")
)


class StrictQueryForm(forms.Form):
    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        unknown = sorted(set(self.data) - set(self.fields))
        if unknown:
            raise forms.ValidationError(f"unknown query parameter: {unknown[0]}")
        return cleaned

    def first_error(self) -> str:
        for field, errors in self.errors.items():
            prefix = "" if field == "__all__" else f"{field}: "
            return f"{prefix}{errors[0]}"
        return "invalid query"


class CursorField(forms.CharField):
    def clean(self, value: Any) -> Any:
        text = super().clean(value)
        if not text:
            return None
        try:
            return cursor_decode(text)
        except ValueError:
            raise forms.ValidationError("invalid cursor") from None


class PageForm(StrictQueryForm):
    cursor = CursorField(required=False, max_length=200)
    limit = forms.IntegerField(required=False, min_value=1, max_value=MAX_PAGE)

    def clean_limit(self) -> int:
        return self.cleaned_data.get("limit") or DEFAULT_PAGE


class WorkItemQueryForm(PageForm):
    status = forms.ChoiceField(required=False, choices=WorkItemStatus.choices)
    route_scope = forms.CharField(required=False, max_length=200)
    project = forms.CharField(required=False)
    reason_code = forms.CharField(required=False, max_length=40)
    account = forms.CharField(required=False, max_length=200)


class DrainQueryForm(PageForm):
    # A route key as the records say it (`generic-event`) or the kind a command takes
    # (`generic`): both name the same drains.
    kind = forms.ChoiceField(
        required=False,
        choices=[(k, k) for k in dict.fromkeys((*ROUTE_KEYS, *KINDS))],
    )
    route_scope = forms.CharField(required=False, max_length=200)

    def clean_kind(self) -> str:
        kind = self.cleaned_data.get("kind") or ""
        return route_key_for_kind(kind) if kind in KINDS else kind


def api_words(message: str) -> str:
    """An option error as the API caller wrote it: `max_active must be a positive integer`,
    not the command-line flag `--max-active` (the messages are the CLI's own)."""
    for name in sorted(OPTION_NAMES, key=len, reverse=True):
        flag = "--" + name.replace("_", "-")
        message = re.sub(re.escape(flag) + r"(?![\w-])", name, message)
    return message


class IngestQueryForm(StrictQueryForm):
    """`route=now` routes the accepted events at once with `kind` and the route options."""

    route = forms.ChoiceField(required=False, choices=[("now", "now")])
    kind = forms.ChoiceField(required=False, choices=[(k, k) for k in KINDS])
    # strict=1: refuse a batch holding envelopes that can never route (default: warn).
    strict = forms.TypedChoiceField(
        required=False,
        choices=[("0", "0"), ("1", "1")],
        coerce=lambda v: v == "1",
        # the stubs say str | None; Django returns any empty_value as it is
        empty_value=False,  # type: ignore[arg-type]
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in INGEST_ROUTE_OPTIONS:
            # Text here; route_options() parses and validates with the CLI's own messages.
            self.fields[name] = forms.CharField(required=False, strip=True)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        raw = {n: cleaned[n] for n in INGEST_ROUTE_OPTIONS if cleaned.get(n)}
        if raw and cleaned.get("route") != "now":
            raise forms.ValidationError("route options need route=now")
        try:
            # No kind: the options are checked alone here, and with each envelope's kind
            # when it is routed.
            cleaned["route_options"] = checked_route_options(
                cleaned.get("kind") or None, raw, env=os.environ
            )
        except ApplicationError as exc:
            raise forms.ValidationError(api_words(str(exc))) from None
        # No kind: each envelope is routed as the drain of its type would take it
        # (`task.*` as todos-task, the rest as generic), and the answer says so.
        cleaned["kind"] = cleaned.get("kind") or None
        return cleaned
