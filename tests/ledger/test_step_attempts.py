"""Every attempt is visible (issue 39): each try of a step on an account is a row of its own
(ledger.services.attempts), opened at the step's start and closed by whatever ends it, and
the item page, the run page, the API, `routes show` and /ops/accounts/ list it.

In-process with the fake agent (the runner as `manage.py run_workflow` calls it); the real
CLIs' 429 is tests/agents/test_runner_real.py."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from ledger import services
from ledger.models import (
    RunStatus,
    WorkflowRun,
    WorkflowStepAttempt,
    WorkflowStepRun,
    WorkflowWorkItem,
)
from routing.models import InboxEvent
from runs.runner import run_workflow_run
from tests.ledger.runner_helpers import FakeAgent, route_generic, steps_of
from tests.routing.api.helpers import bearer, make_token

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

CODEX_USAGE = json.dumps(
    {
        "type": "turn.completed",
        "usage": {
            "input_tokens": 1200,
            "cached_input_tokens": 200,
            "output_tokens": 34,
        },
    }
)


def _attempts(run: WorkflowRun, step_id: str) -> list[tuple[str | None, str]]:
    return [
        (a.account_profile, a.status)
        for a in WorkflowStepAttempt.objects.filter(
            workflow_run=run, step_id=step_id
        ).order_by("started_at", "id")
    ]


def _page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


def test_a_rate_limited_attempt_stays_on_record_on_every_surface(
    agent: FakeAgent, tmp_path: Path, admin_client: Client
) -> None:
    # A codex pool routes over registered codex accounts (codex prints usage to read).
    # Three accounts: after the worker's move, the verifier still has one that is neither
    # the worker's nor cooling (worker != verifier; with two it would wait for the cooldown).
    for name in ("acctA", "acctB", "acctC"):
        services.account_add(name=name, provider="codex")
    run = route_generic(
        tmp_path,
        message="It fails <script>alert(1)</script> one run in ten.",
        auth_profile_pool="acctA,acctB,acctC",
        provider="codex",
        created=True,
    ).run
    first = steps_of(run)["worker"].account_profile
    agent.configure(
        default={"output": CODEX_USAGE},
        profiles={first: {"rate_limit": "HTTP 429 Too Many Requests"}},
    )

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED, (
        WorkflowRun.objects.get(pk=run.id).error,
        str(
            list(
                WorkflowStepAttempt.objects.filter(workflow_run=run).values_list(
                    "step_id", "account_profile", "status"
                )
            )
        ),
        str([(r["step"], r["profile"]) for r in agent.records()]),
    )

    other = steps_of(run)["worker"].account_profile
    assert other != first and other != steps_of(run)["verifier"].account_profile
    assert _attempts(run, "worker") == [(first, "rate_limited"), (other, "succeeded")]
    assert len(_attempts(run, "verifier")) == 1
    limited = WorkflowStepAttempt.objects.get(workflow_run=run, status="rate_limited")
    assert limited.finished_at and limited.duration_ms is not None
    assert "429" in (limited.error or "")
    story = f"worker: {first} → rate limited after "

    item = WorkflowWorkItem.objects.get(pk=run.work_item_id)
    html = _page(admin_client, reverse("ops:work-item", args=[item.id]))
    runs = html.split('id="runs"')[1].split("</section>")[0]
    assert story in runs and f"→ {other}, succeeded in " in runs, runs
    # tokens per step (both attempts printed usage), per run and for the item
    assert "2,400 in / 68 out (cached 400)" in runs  # the worker: two attempts
    assert "3,600 in / 102 out (cached 600)" in runs  # the run: worker + verifier
    assert "3,600 in / 102 out" in html.split('id="item-usage"')[1].split("</tr>")[0]
    # the task as its event tells it (a generic event's message), escaped
    task = html.split('id="task-title"')[1].split("</tr>")[0]
    assert "It fails &lt;script&gt;alert(1)&lt;/script&gt; one run in ten." in task
    assert "<script>alert" not in html

    run_page = _page(admin_client, f"/admin/ledger/workflowrun/{run.id}/change/")
    assert story in run_page and "3,600 in / 102 out" in run_page
    admin_item = _page(
        admin_client, reverse("admin:ledger_workflowworkitem_change", args=[item.id])
    )
    assert story in admin_item

    _, token = make_token("read")
    body = Client().get(f"/api/v1/work-items/{item.id}", **bearer(token)).json()
    (api_run,) = body["runs"]
    worker = next(s for s in api_run["steps"] if s["stepId"] == "worker")
    assert [(a["accountProfile"], a["status"]) for a in worker["attempts"]] == [
        (first, "rate_limited"),
        (other, "succeeded"),
    ]
    assert worker["attemptsText"].startswith(story)
    assert worker["usage"] == {
        "inputTokens": 2400,
        "outputTokens": 68,
        "cachedTokens": 400,
        "costUsd": None,
    }
    assert api_run["usage"]["inputTokens"] == 3600
    assert body["usage"]["inputTokens"] == 3600

    out = io.StringIO()
    call_command("routes", "show", item.id, stdout=out)
    assert f"    {story}" in out.getvalue(), out.getvalue()
    out = io.StringIO()
    call_command("routes", "show", item.id, "--json", stdout=out)
    shown = json.loads(out.getvalue())["runs"][0]["steps"]
    assert [len(s["attempts"]) for s in shown] == [2, 1]

    # /ops/accounts/: the rate-limited account keeps its attempt (a step, a failure and a
    # rate limit in 24 h and 7 d), where it showed 0 once the step had moved on.
    accounts = _page(admin_client, reverse("ops:accounts"))
    row = accounts.split(f"<code>{first}</code>")[1].split("</tr>")[0]
    cells = [c.split("</td>")[0] for c in row.split('<td class="num')[1:]]
    counts = [c.split(">")[-1].strip() for c in cells][-4:]
    verifier = steps_of(run)["verifier"].account_profile
    # the verifier ran on one of the two accounts as well
    expected = ["2", "2", "1", "1"] if verifier == first else ["1", "1", "1", "1"]
    assert counts == expected, (counts, first, verifier)


def test_a_failed_item_shows_its_error_and_its_inbox_event_follows_it(
    agent: FakeAgent, tmp_path: Path, admin_client: Client
) -> None:
    agent.configure(default={"exit": 3, "stderr": "boom: the build is broken"})
    result = route_generic(tmp_path, auth_profile="acctA", created=True)
    run = result.run
    assert run_workflow_run(run.id) == RunStatus.FAILED
    item = WorkflowWorkItem.objects.get(pk=run.work_item_id)
    assert item.status == "failed"
    InboxEvent.objects.create(
        source="ci",
        event_id="evt-failed-1",
        event_type="build.failed",
        state="admitted",
        work_item_id=item.id,
        data={},
    )
    html = _page(admin_client, reverse("ops:work-item", args=[item.id]))
    inbox = html.split('id="inbox"')[1].split("</section>")[0]
    assert "admitted → failed" in inbox
    runs = html.split('id="runs"')[1].split("</section>")[0]
    assert "boom: the build is broken" in runs
    assert "worker: acctA → failed after " in runs

    listing = _page(
        admin_client,
        reverse("admin:ledger_workflowworkitem_changelist") + "?status=failed",
    )
    cell = listing.split('class="field-reason_cell"')[1].split("</td>")[0]
    assert "step worker failed" in cell, cell


def test_a_running_steps_page_shows_its_last_lines_and_a_cancel_closes_its_attempt(
    tmp_path: Path, admin_client: Client
) -> None:
    run = route_generic(tmp_path, auth_profile="acctA", created=True).run
    run = services.run_claim(run_id=run.id, worker="w")
    assert run is not None
    worker = steps_of(run)["worker"]
    assert services.step_start(step_run_id=worker.id, worker="w").started
    lines = "\n".join(f"line {n}" for n in range(1, 31))
    services.step_output_record(step_run_id=worker.id, stdout=lines, stderr="")
    assert _attempts(run, "worker") == [("acctA", "running")]

    html = _page(admin_client, reverse("ops:work-item", args=[run.work_item_id]))
    live = html.split('class="step-live"')[1].split("</pre>")[0]
    assert "line 30" in live and "line 19" in live and "line 18\n" not in live
    assert "worker: acctA, running for " in html

    services.run_cancel(run_id=run.id, reason="operator stop")
    assert _attempts(run, "worker") == [("acctA", "cancelled")]
    attempt = WorkflowStepAttempt.objects.get(workflow_run=run)
    assert attempt.finished_at is not None and attempt.error == "operator stop"
    assert WorkflowStepRun.objects.get(pk=worker.id).status == "cancelled"


def test_a_skipped_running_step_closes_its_attempt(tmp_path: Path) -> None:
    run = route_generic(tmp_path, auth_profile="acctA", created=True).run
    services.run_claim(run_id=run.id, worker="w")
    worker = steps_of(run)["worker"]
    services.step_start(step_run_id=worker.id, worker="w")
    services.step_skip(step_run_id=worker.id, reason="not needed")
    assert _attempts(run, "worker") == [("acctA", "skipped")]
