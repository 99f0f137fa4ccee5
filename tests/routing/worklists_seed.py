"""Rows for the "Needs attention" and "Delivered" tests (pages, API, browser): work items
whose runs failed, timed out, were not delivered or were delivered, with steps on accounts
and their usage, written directly through the factories."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from ledger.models import (
    WorkflowRun,
    WorkflowStepAttempt,
    WorkflowWorkItem,
)
from ledger.services.retries import DEAD_LETTERED_CODE, DEAD_LETTERED_REASON
from tests.factories import make_invocation, make_run, make_step_run, make_work_item

# A title an agent or a task could carry: the pages must show it as text.
HOSTILE_TITLE = '<script>alert("x")</script> Fix <b>login</b>'


def item_with_run(
    *,
    title: str,
    item_status: str,
    run_status: str,
    error: str | None = None,
    delivery: dict[str, Any] | None = None,
    project: str = "/srv/web",
    scope: str = "nightly",
    accounts: tuple[str, ...] = ("acct-a",),
    step_status: str = "succeeded",
    step_reason: str = "",
    cost: float | None = 0.25,
    finished_at: datetime | None = None,
) -> WorkflowWorkItem:
    """A work item bound to one ended run: a worker step whose attempts ran on `accounts`
    in order (each 1,000 tokens in, 100 out and `cost`), the last one ending with
    `step_status`."""
    invocation = make_invocation(subject_json={"raw": {"title": title}})
    item = make_work_item(
        invocation=invocation,
        status=item_status,
        project_key=project,
        route_scope=scope,
        attempts=1,
        last_reason=None,
    )
    run = make_run(
        work_item=item,
        status=run_status,
        error=error,
        delivery_json=delivery,
        finished_at=finished_at or timezone.now(),
        worktree_branch=f"loopsweb/run-{item.id[-6:]}",
    )
    step = make_step_run(
        workflow_run=run,
        step_id="worker",
        status=step_status,
        reason_code=step_reason,
        account_profile=accounts[-1],
        account_tool="codex",
    )
    for n, profile in enumerate(accounts):
        WorkflowStepAttempt.objects.create(
            step_run=step,
            workflow_run=run,
            step_id="worker",
            account_profile=profile,
            account_tool="codex",
            status="rate_limited" if n < len(accounts) - 1 else step_status,
            started_at=timezone.now(),
            usage_input_tokens=1000,
            usage_output_tokens=100,
            usage_cost_usd=cost,
        )
    WorkflowWorkItem.objects.filter(pk=item.pk).update(workflow_run=run)
    item.refresh_from_db()
    return item


def pull_request_delivery(
    number: int, state: str = "open", *, url: str | None = None
) -> dict[str, Any]:
    return {
        "mode": "pull-request",
        "state": "delivered",
        "remote": "origin",
        "url": "https://github.com/acme/web.git",
        "ref": f"refs/heads/loopsweb/run-{number}",
        "commit": "0123456789abcdef0123456789abcdef01234567",
        "pushedAt": timezone.now().isoformat(),
        "pr": {
            "repo": "acme/web",
            "number": number,
            "url": url or f"https://github.com/acme/web/pull/{number}",
            "state": state,
            "draft": False,
        },
    }


def pushed_delivery() -> dict[str, Any]:
    return {
        "mode": "push",
        "state": "delivered",
        "remote": "origin",
        "url": "https://git.example.com/acme/web.git",
        "ref": "refs/heads/loopsweb/run-pushed",
        "commit": "fedcba9876543210fedcba9876543210fedcba98",
        "pushedAt": timezone.now().isoformat(),
    }


REFUSED = "delivery failed: git push to https://github.com/acme/web.git refused: denied"


def refused_delivery() -> dict[str, Any]:
    return {
        "mode": "push",
        "state": "failed",
        "remote": "origin",
        "url": "https://github.com/acme/web.git",
        "error": REFUSED,
    }


def seed_attention() -> dict[str, WorkflowWorkItem]:
    """One item of each kind of attention, and items that need none."""
    return {
        "failed": item_with_run(
            title=HOSTILE_TITLE,
            item_status="failed",
            run_status="failed",
            error="worker exited 1: tests fail",
            accounts=("acct-a", "acct-b"),
            step_status="failed",
            step_reason="login_failed",
        ),
        "timed_out": item_with_run(
            title="Slow migration",
            item_status="failed",
            run_status="timed_out",
            error="the run timed out after 3600 s",
            project="/srv/api",
            scope="daily",
            accounts=("acct-c",),
            step_status="timed_out",
            step_reason="failed",
        ),
        "not_delivered": item_with_run(
            title="Bump the parser",
            item_status="succeeded",
            run_status="succeeded",
            delivery=refused_delivery(),
            cost=None,
        ),
        "succeeded": item_with_run(
            title="All good", item_status="succeeded", run_status="succeeded"
        ),
        "cancelled": item_with_run(
            title="Cancelled one", item_status="cancelled", run_status="cancelled"
        ),
        "dead_letter": item_with_run(
            title="Given up", item_status="dead_letter", run_status="failed"
        ),
        "running": item_with_run(
            title="Still running", item_status="running", run_status="running"
        ),
    }


FLAKY = "step worker failed: step exited with code 3"
DEAD_LETTERED = DEAD_LETTERED_REASON.format(count=8, reason=FLAKY)


def dead_lettered_item(**fields: Any) -> WorkflowWorkItem:
    """An item the re-dispatch bound set aside, as ledger/services/retries.py
    `_dead_letter` leaves it: `dead_letter`, reason code `dead_lettered`, its reason naming
    the count and its last run's error (that run `failed`)."""
    item = item_with_run(
        title=fields.pop("title", "Flaky suite"),
        item_status="dead_letter",
        run_status="failed",
        error=FLAKY,
        step_status="failed",
        step_reason="failed",
        **fields,
    )
    WorkflowWorkItem.objects.filter(pk=item.pk).update(
        reason_code=DEAD_LETTERED_CODE, last_reason=DEAD_LETTERED
    )
    item.refresh_from_db()
    return item


def seed_delivered() -> dict[str, WorkflowRun]:
    """Runs delivered as an open, a merged pull request and a pushed branch, and runs
    that were not delivered."""

    def run_of(item: WorkflowWorkItem) -> WorkflowRun:
        return WorkflowRun.objects.get(pk=item.workflow_run_id)

    return {
        "open": run_of(
            item_with_run(
                title=HOSTILE_TITLE,
                item_status="succeeded",
                run_status="succeeded",
                delivery=pull_request_delivery(12),
                accounts=("acct-a", "acct-b"),
            )
        ),
        "merged": run_of(
            item_with_run(
                title="Merged change",
                item_status="succeeded",
                run_status="succeeded",
                delivery=pull_request_delivery(13, "merged", url="javascript:alert(1)"),
                project="/srv/api",
            )
        ),
        "pushed": run_of(
            item_with_run(
                title="Pushed change",
                item_status="succeeded",
                run_status="succeeded",
                delivery=pushed_delivery(),
            )
        ),
        "refused": run_of(
            item_with_run(
                title="Refused",
                item_status="succeeded",
                run_status="succeeded",
                delivery=refused_delivery(),
            )
        ),
        "kept": run_of(
            item_with_run(
                title="Kept locally",
                item_status="succeeded",
                run_status="succeeded",
                delivery={"mode": "branch", "state": "kept"},
            )
        ),
    }
