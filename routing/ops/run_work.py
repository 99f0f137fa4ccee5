"""The run's work on the /ops/ pages: "Deliver again" and "Discard" (POST, CSRF,
the item change permission, audited as the item actions are), and the run's whole patch as
plain text ("show all": `text/plain`, `nosniff`, so nothing in it is ever markup). Both need
the runs' view permission too, as the admin's run page (ledger.webkit.access)."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
)
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from domain.errors import ApplicationError
from ledger.models import WorkflowRun
from ledger.webkit import access
from ledger.webkit.audit import log_operator_action
from routing.ops.views import ops_view
from routing.templatetags.ops_tags import ITEM_ACTION_PERMISSION
from runs.delivery import deliver_run, delivery_outcome, redeliverable
from runs.delivery_view import PATCH_MOST_CHARS, run_patch
from runs.discard import discard_run_work

RUN_ACTIONS = ("deliver", "discard")


@ops_view(access.RUNS)
@require_POST
def run_action(request: HttpRequest, run_id: str, action: str) -> HttpResponse:
    """Deliver again (`runs.delivery.deliver_run`) or discard (`runs.discard`) one
    run's work; back to `next` when it is this site's, else the run's item page."""
    if action not in RUN_ACTIONS:
        raise Http404
    if not request.user.has_perm(ITEM_ACTION_PERMISSION):
        raise PermissionDenied
    run = get_object_or_404(WorkflowRun.objects.select_related("workflow"), pk=run_id)
    if action == "deliver":
        if not redeliverable(run):
            messages.error(request, "deliver refused: nothing to deliver again")
        else:
            delivered, line = delivery_outcome(run.id, deliver_run(run.id))
            # Green only when the record says delivered: a skip or a failure is an error.
            if delivered:
                messages.success(request, line)
            else:
                messages.error(request, line)
            log_operator_action(
                request, WorkflowRun, run.id, "Deliver again (ops)", line
            )
    else:
        try:
            done = discard_run_work(
                run.id, reason=f"discarded by {request.user.get_username()}"
            )
        except ApplicationError as exc:
            messages.error(request, f"discard refused: {exc}")
        else:
            log_operator_action(
                request, WorkflowRun, run.id, "Discard the work (ops)", done.reason
            )
            messages.success(request, f"Run {run.id}: work discarded.")
    target = request.POST.get("next") or ""
    if not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        target = (
            reverse("ops:work-item", args=[run.work_item_id])
            if run.work_item_id
            else reverse("ops:overview")
        )
    return HttpResponseRedirect(target)


@ops_view(access.RUNS)
def run_patch_all(request: HttpRequest, run_id: str) -> HttpResponse:
    """The whole patch of the run's branch against its base, as plain text."""
    run = get_object_or_404(WorkflowRun.objects.select_related("workflow"), pk=run_id)
    patch = run_patch(run, limit=PATCH_MOST_CHARS)
    if patch is None:
        raise Http404
    text = patch.error or patch.text
    if patch.truncated:
        text += f"\n[cut at {PATCH_MOST_CHARS} characters]\n"
    response = HttpResponse(text, content_type="text/plain; charset=utf-8")
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Disposition"] = "inline"
    return response
