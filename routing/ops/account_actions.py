"""/ops/accounts/'s Clear: an operator clears what steps' output claimed about an account
(its cooldown, exhausted windows, login mark: `ledger.services.account_clear`), audited."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from ledger import services
from ledger.models import Account
from ledger.services import LedgerError
from ledger.webkit import access
from ledger.webkit.audit import log_operator_action
from routing.ops.views import ops_view

CLEAR_PERMISSION = "ledger.change_account"


@ops_view(access.ACCOUNTS)
@require_POST
def account_clear(request: HttpRequest, name: str) -> HttpResponse:
    if not request.user.has_perm(CLEAR_PERMISSION):
        raise PermissionDenied
    try:
        done = services.account_clear(name=name)
    except LedgerError as exc:
        messages.error(request, f"clear refused: {exc}")
    else:
        if done.anything:
            log_operator_action(
                request, Account, done.name, "Clear the account (ops)", done.text()
            )
        messages.success(request, f"Account {done.name}: cleared {done.text()}.")
    return HttpResponseRedirect(reverse("ops:accounts"))
