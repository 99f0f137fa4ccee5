"""An operator's retry re-admits the item with the route it stores.

Every admission decision stores its route on the item (`plan.stored_route`: the route kind,
the options with the scope as resolved, the event envelope). `retry_work_item` is one
transaction under the admission lock: it requeues the item (`ledger.services`), plans the
stored event with the stored options and admits it at once, through the same `admit` a
drain or the API uses: the caps and the pool still decide, so a capped retry is recorded as
a deferral with its reason. The inbox rows that produced the item record the outcome once,
as a drain's would. The admin reaches it by its dotted path (ledger.admin.actions), the
/ops/ pages and `routes retry` by import. A deferred retry
keeps its route (the stored route is marked `retry`): the drain that meets its inbox row
later admits it with the stored route, not the drain's options (`transaction.admit`).

The retry re-picks accounts: a pool-routed route leaves out the pool members that failed
this item (rate limited, login failed, unresponsive: the `ACCOUNT_FAILURES` attempts of its
earlier runs), unless none would be left; the run's pool (what failover moves among) is the
pool without them (`without_failed_accounts`).

Bad input raises (the stored project no longer inside LOOPSWEB_PROJECT_ROOTS, a template
gone): the retry's transaction rolls back and the item stays as it was.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from domain.errors import ValidationError
from ledger import services
from ledger.lock import admission_lock
from ledger.models import WorkflowStepAttempt, WorkflowWorkItem, WorkItemStatus
from ledger.services.attempts import ACCOUNT_FAILURES
from ledger.services.common import ITEM_RETRY_REASON
from routing.admission.plan import RoutePlan, plan_reads, plan_stored_route
from routing.admission.results import THROTTLED, RouteResult
from routing.admission.transaction import admit, hand_over
from routing.models import InboxEvent, InboxState

RETRY_NOT_ELIGIBLE = "retry refused: the stored event no longer routes: {reason}"
RETRY_OTHER_ITEM = (
    "retry refused: the stored route names another work item ({key}), not {item_id}"
)


def retry_work_item(
    *,
    item_id: str,
    reason: str | None = None,
    expected_run_id: str | None = None,
    actor: str | None = None,
    now: datetime | None = None,
) -> WorkflowWorkItem:
    """An operator's retry, one transaction under the admission lock: requeue the item
    (`services.work_item_requeue`, action `retry`), plan its stored route, admit it, and
    record the outcome on the inbox rows that produced it, once. An item that stores no
    route stays `queued`, its inbox rows reopened for the next drain, as a requeue. Returns
    the item as the retry left it; bad input raises and changes nothing."""
    now = now or timezone.now()
    with transaction.atomic():
        admission_lock()
        item = services.work_item_requeue(
            item_id=item_id,
            reason=reason or ITEM_RETRY_REASON,
            expected_run_id=expected_run_id,
            actor=actor,
            action="retry",
            now=now,
            reopen_inbox=False,
        )
        if _readmit(item, now) is None:
            item_inbox_reopen(item, now)
    item.refresh_from_db()
    return item


def retry_run(
    *,
    run_id: str,
    reason: str | None = None,
    actor: str | None = None,
    now: datetime | None = None,
) -> WorkflowWorkItem:
    """Retry the work item of a failed, timed-out or cancelled run, which must be the
    item's latest run (`services.run_retry_item`; then `retry_work_item`)."""
    item_id, why = services.run_retry_item(run_id=run_id, reason=reason)
    return retry_work_item(
        item_id=item_id, reason=why, expected_run_id=run_id, actor=actor, now=now
    )


def item_inbox_reopen(item: WorkflowWorkItem, now: datetime) -> None:
    """The inbox rows that produced `item` go back to `pending`, so the next drain routes
    it again (a requeue's, and a retry's without a stored route)."""
    InboxEvent.objects.filter(work_item_id=item.id).exclude(
        state=InboxState.PENDING
    ).update(
        state=InboxState.PENDING,
        reason_code=None,
        last_reason=item.last_reason,
        updated_at=now,
    )


def _readmit(item: WorkflowWorkItem, now: datetime) -> RouteResult | None:
    """Admit the requeued `item` now with its stored route, its inbox rows recording the
    outcome; None when it stores none."""
    route = item.route_options_json
    if not isinstance(route, dict):
        return None
    plan = plan_stored_route(route, reads=plan_reads())
    if isinstance(plan, RouteResult):
        raise ValidationError(RETRY_NOT_ELIGIBLE.format(reason=plan.reason))
    if (plan.route_key, plan.idempotency_key) != (item.route_key, item.idempotency_key):
        raise ValidationError(
            RETRY_OTHER_ITEM.format(key=plan.idempotency_key, item_id=item.id)
        )
    plan = without_failed_accounts(plan, failed_accounts(item))
    result = admit(plan, now=now, enqueue=False)
    assert isinstance(result, RouteResult)  # no holds without hold_when_full
    deferred = result.kind == THROTTLED
    InboxEvent.objects.filter(work_item_id=item.id).update(
        state=InboxState.DEFERRED if deferred else InboxState.ADMITTED,
        last_reason=result.reason
        or (result.work_item.last_reason if result.work_item else None),
        reason_code=result.reason_code,
        routed_at=now,
        updated_at=now,
    )
    hand_over(result)
    return result


def failed_accounts(item: WorkflowWorkItem) -> set[str]:
    """The accounts that failed `item` in its runs so far (ledger.services.attempts
    ACCOUNT_FAILURES: a rate limit, a refused login, a hang); one query."""
    return {
        (name or "").strip()
        for name in WorkflowStepAttempt.objects.filter(
            workflow_run__work_item_id=item.id,
            status__in=ACCOUNT_FAILURES,
            account_profile__isnull=False,
        ).values_list("account_profile", flat=True)
    }


def without_failed_accounts(plan: RoutePlan, failed: set[str]) -> RoutePlan:
    """`plan` with the pool members in `failed` left out of its pool (the pool assignment)
    and of the run's pool (`providerRouting.pool`, what failover moves among); `plan` as
    it is when it does not route a pool, names none of them, or none would be left."""
    if not plan.pool_active:
        return plan
    kept = tuple(m for m in plan.pool if m.strip() not in failed)
    if not kept or len(kept) == len(plan.pool):
        return plan
    fields = dict(plan.invocation_fields)
    scope = dict(fields.get("scope_json") or {})
    scope["providerRouting"] = {
        **(scope.get("providerRouting") or {}),
        "pool": [m.strip() for m in kept],
    }
    fields["scope_json"] = scope
    return replace(plan, pool=kept, invocation_fields=fields)


def retry_outcome(item: WorkflowWorkItem) -> str:
    """One line on where a retry left `item` (the command, the /ops/ and admin messages)."""
    if item.status == WorkItemStatus.ADMITTED:
        return (
            f"retried {item.id}: admitted again as run {item.workflow_run_id} with its "
            f"route (attempt {item.attempts})"
        )
    if item.status == WorkItemStatus.DEFERRED:
        latest = item.deferrals.order_by("-created_at", "-id").first()
        why = latest.reason if latest is not None else item.last_reason
        return (
            f"retried {item.id}: deferred ({item.reason_code}): {why}; it waits for "
            "capacity"
        )
    return (
        f"retried {item.id}: requeued ({item.status}); it stores no route (admitted "
        "before routes were stored), so the next drain routes it with that drain's options"
    )
