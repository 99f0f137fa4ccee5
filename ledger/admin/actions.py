"""The lifecycle actions (requeue, cancel, dead-letter, retry): a confirmation page that
shows how many rows the action touches, then one service call per row.

Every row an action changes gets an admin `LogEntry` (who, when, the action and the reason:
the item page's action history), and the service names the user in the run's workflow
event.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db.models import Model, Q, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.module_loading import import_string

from domain.errors import ApplicationError
from ledger import services
from ledger.webkit.audit import log_operator_action

# --- lifecycle actions ------------------------------------------------------------------------

# One action request runs one short transaction per row; bound the batch so a request
# finishes well inside a proxy timeout. Larger clean-ups belong in a command.
MAX_ACTION_ROWS = 500


class ActionReasonForm(forms.Form):
    reason = forms.CharField(
        label="Reason",
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
    )

    def __init__(
        self, *args: Any, required: bool, placeholder: str = "", **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["reason"]
        # The default reason is a placeholder, never a value: typed text replaces it
        # instead of being appended to it, and an empty box means the default.
        field.required = required and not placeholder
        if placeholder:
            field.widget.attrs["placeholder"] = placeholder


@dataclass(frozen=True)
class LifecycleAction:
    """One confirmed admin action: what it is called and the service it runs per row."""

    name: str  # the admin action's name (the POSTed `action`)
    title: str
    done: str  # past tense for the message: "requeued"
    explanation: str
    # (pk, reason, user name) -> the changed row
    apply: Callable[[str, str | None, str], object]
    reason_required: bool = True
    default_reason: str = ""
    # False: the service records its own (upstream) reason; the page shows no reason field.
    asks_reason: bool = True


def action_history(
    targets: list[tuple[type[Model], list[str]]], *, limit: int = 50
) -> list[LogEntry]:
    """The LogEntry rows of these objects (per model, their ids), newest first."""
    match = Q(pk__in=[])
    for model, ids in targets:
        if ids:
            content_type = ContentType.objects.get_for_model(model)
            match |= Q(content_type=content_type, object_id__in=ids)
    return list(
        LogEntry.objects.filter(match)
        .select_related("user", "content_type")
        .order_by("-action_time")[:limit]
    )


def run_lifecycle_action(
    model_admin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet,
    action: LifecycleAction,
) -> TemplateResponse | None:
    """First POST: a confirmation page with the count and a reason field. Confirmed POST:
    call the service once per row, then `message_user` with how many changed and why the
    others did not (each service refuses rows whose status does not allow the change)."""
    opts = model_admin.model._meta
    ids = list(
        queryset.order_by("pk").values_list("pk", flat=True)[: MAX_ACTION_ROWS + 1]
    )
    if len(ids) > MAX_ACTION_ROWS:
        model_admin.message_user(
            request,
            f"Select at most {MAX_ACTION_ROWS} {opts.verbose_name_plural} per action "
            f"(narrow the list with the filters).",
            messages.ERROR,
        )
        return None
    if request.POST.get("confirm") == "yes":
        form = ActionReasonForm(
            request.POST,
            required=action.reason_required,
            placeholder=action.default_reason,
        )
        if form.is_valid():
            reason = (
                form.cleaned_data["reason"].strip() or action.default_reason or None
            )
            _apply_to_rows(model_admin, request, ids, action, reason)
            return None
    else:
        form = ActionReasonForm(
            required=action.reason_required, placeholder=action.default_reason
        )
    return _confirmation_page(model_admin, request, ids, action, form)


def _apply_to_rows(
    model_admin: admin.ModelAdmin,
    request: HttpRequest,
    ids: list[Any],
    action: LifecycleAction,
    reason: str | None,
) -> None:
    """The confirmed action: the service once per row, then what changed and what not."""
    opts = model_admin.model._meta
    done, refused = 0, []
    actor = request.user.get_username()
    for pk in ids:
        try:
            action.apply(pk, reason, actor)
            done += 1
            log_operator_action(request, model_admin.model, pk, action.title, reason)
        except ApplicationError as exc:
            refused.append(str(exc))
    noun = opts.verbose_name if done == 1 else opts.verbose_name_plural
    model_admin.message_user(
        request,
        f"{action.done.capitalize()} {done} {noun}.",
        messages.SUCCESS if done else messages.WARNING,
    )
    if refused:
        more = f" (and {len(refused) - 5} more)" if len(refused) > 5 else ""
        model_admin.message_user(
            request,
            f"{len(refused)} not {action.done}: {'; '.join(refused[:5])}{more}",
            messages.WARNING,
        )


def _confirmation_page(
    model_admin: admin.ModelAdmin,
    request: HttpRequest,
    ids: list[Any],
    action: LifecycleAction,
    form: ActionReasonForm,
) -> TemplateResponse:
    """The page asking to confirm the action on `ids`, with the reason `form`."""
    opts = model_admin.model._meta
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(
        request,
        "admin/ledger/confirm_action.html",
        {
            **model_admin.admin_site.each_context(request),
            "title": action.title,
            "subtitle": None,
            "opts": opts,
            "action": action,
            "ids": ids,
            "count": len(ids),
            "noun": opts.verbose_name if len(ids) == 1 else opts.verbose_name_plural,
            "preview": list(
                model_admin.model.objects.filter(pk__in=ids[:20]).order_by("-pk")
            ),
            "form": form,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "media": model_admin.media,
        },
    )


REQUEUE = LifecycleAction(
    name="requeue_items",
    title="Requeue work items",
    done="requeued",
    explanation=(
        "Upstream `routes requeue`: only succeeded, failed, dead-letter and cancelled items "
        "go back to queued (bindings cleared, attempts kept); their inbox events reopen so "
        "the next drain admits them again. A reason is required."
    ),
    apply=lambda pk, reason, actor: services.work_item_requeue(
        item_id=pk, reason=reason or "", actor=actor
    ),
)
# A retry is admission's operation (lock, requeue, plan, admit, the inbox rows once), above
# the ledger: reached by its dotted path, as django-q2 reaches a task, never imported.
RETRY_ITEM_OPERATION = "routing.admission.retry_work_item"
RETRY_RUN_OPERATION = "routing.admission.retry_run"


def _admission(path: str) -> Callable[..., object]:
    return cast(Callable[..., object], import_string(path))


# What a retry does, whichever the admin selected: the items, or the runs of the items.
RETRY_EXPLANATION = (
    "admitted again now with the route it was admitted with (provider, pool, scope, caps, "
    "template, sandbox, worktree mode, time limits); the caps still apply, so a capped "
    "retry waits as a deferral with its reason. The reason is optional."
)
RETRY_ITEMS = LifecycleAction(
    name="retry_items",
    title="Retry work items",
    done="retried",
    explanation="Each succeeded, failed, dead-letter or cancelled item is "
    + RETRY_EXPLANATION,
    apply=lambda pk, reason, actor: _admission(RETRY_ITEM_OPERATION)(
        item_id=pk, reason=reason, actor=actor
    ),
    reason_required=False,
)
CANCEL_ITEMS = LifecycleAction(
    name="cancel_items",
    title="Cancel work items",
    done="cancelled",
    explanation=(
        "Queued, deferred, admitted and running items become cancelled; a run still in "
        "progress is cancelled with its item (its process is stopped)."
    ),
    apply=lambda pk, reason, actor: services.work_item_cancel(
        item_id=pk, reason=reason or "", actor=actor
    ),
    default_reason=services.CANCEL_REASON_DEFAULT,
)
DEAD_LETTER = LifecycleAction(
    name="dead_letter_items",
    title="Dead-letter work items",
    done="dead-lettered",
    explanation=(
        "Parks items as dead_letter until someone requeues them; later deliveries of their "
        "events dedupe. Admitted or running items must be cancelled first."
    ),
    apply=lambda pk, reason, actor: services.work_item_dead_letter(
        item_id=pk, reason=reason or "", actor=actor
    ),
    default_reason="dead-lettered by operator",
)
RETRY_RUNS = LifecycleAction(
    name="retry_runs",
    title="Retry workflow runs",
    done="retried",
    explanation="The work item of each failed, timed-out or cancelled run (its latest "
    "run) is " + RETRY_EXPLANATION,
    apply=lambda pk, reason, actor: _admission(RETRY_RUN_OPERATION)(
        run_id=pk, reason=reason, actor=actor
    ),
    reason_required=False,
)
CANCEL_RUNS = LifecycleAction(
    name="cancel_runs",
    title="Cancel workflow runs",
    done="cancelled",
    explanation=(
        "Queued and running runs are cancelled with their open steps and work item; a "
        "running step's process is stopped."
    ),
    apply=lambda pk, reason, actor: services.run_cancel(
        run_id=pk, reason=reason or services.CANCEL_REASON_DEFAULT, actor=actor
    ),
    default_reason=services.CANCEL_REASON_DEFAULT,
)


def _loop_action(
    action: str, title: str, done: str, explanation: str
) -> LifecycleAction:
    return LifecycleAction(
        name=f"{action}_loops",
        title=title,
        done=done,
        explanation=explanation,
        apply=lambda pk, _reason, _actor: services.loop_status_change(
            loop_id=pk, action=action
        ),
        reason_required=False,
        asks_reason=False,
    )


PAUSE_LOOPS = _loop_action(
    "pause",
    "Pause loops",
    "paused",
    "Active loops become paused: their admitted and running work items become deferred "
    "(reason `loop paused`) and a run in progress is cancelled (its agent is stopped, its "
    "account freed). Resume runs those items again.",
)
RESUME_LOOPS = _loop_action(
    "resume",
    "Resume loops",
    "resumed",
    "Paused or archived loops become active; each work item they parked runs again at once "
    "(a new run on the same accounts; reason `loop resumed`).",
)
ARCHIVE_LOOPS = _loop_action(
    "archive",
    "Archive loops",
    "archived",
    "Loops are archived (and paused): their admitted and running work items become "
    "deferred (reason `loop archived`); a run in progress is cancelled.",
)
STOP_LOOPS = _loop_action(
    "stop",
    "Stop loops",
    "stopped",
    "Loops become stopped: their admitted, running and parked work items are cancelled "
    "(reason `loop stopped`); a run in progress is cancelled and its agent stopped.",
)
DELETE_LOOPS = _loop_action(
    "delete",
    "Delete loops",
    "deleted",
    "Loops are deleted: their admitted, running and parked work items are cancelled "
    "(reason `loop deleted`) and keep their history; a run in progress is cancelled.",
)
LOOP_ACTIONS = (PAUSE_LOOPS, RESUME_LOOPS, ARCHIVE_LOOPS, STOP_LOOPS, DELETE_LOOPS)
