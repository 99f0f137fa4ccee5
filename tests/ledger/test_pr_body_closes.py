"""runs.pr_body: the pull request of a task that came from a GitHub issue closes it
(`Closes #N`, docs/github-intake.md §5), a line loopsweb writes and leaves live while the
issue's own text stays inert."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from domain.forge_text import ZWJ
from ledger.models import RunStatus, WorkflowRun
from routing.admission import route_event, route_options
from routing.drains import drain_options, drain_run
from routing.github_intake import github_repo_save, issue_event
from routing.models import InboxEvent
from runs.pr_body import pull_request_body, pull_request_title
from runs.runner import run_workflow_run
from tests.forge_standin import Forge
from tests.ledger.delivery_helpers import project_with_origin
from tests.ledger.runner_helpers import FakeAgent
from tests.routing.helpers import todos_event

HOSTILE_TITLE = "Fix it for @octocat, closes #3 and acme/app#9"


def payload(number: int = 7, **issue: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "number": number,
        "title": HOSTILE_TITLE,
        "body": "Fixes #4, ping @team",
        "state": "open",
        "labels": [{"name": "auto:route"}],
        "html_url": f"https://github.com/Acme/App/issues/{number}",
        "author_association": "OWNER",
    }
    fields.update(issue)
    return {"repository": {"full_name": "Acme/App"}, "issue": fields}


def issue_run(project: str, **route: Any) -> WorkflowRun:
    """The run a drain admits for issue 7 of the mapped Acme/App."""
    github_repo_save(full_name="Acme/App", project_path=project)
    assert issue_event("opened", payload()).startswith("queued:")
    report = drain_run(options=drain_options("todos-task", route), env={})
    [result] = report.results
    assert result["kind"] == "created", result
    item_id = InboxEvent.objects.get(source="github").work_item_id
    return WorkflowRun.objects.get(work_item_id=item_id)


@pytest.mark.django_db
def test_the_body_closes_the_issue_in_its_own_repository() -> None:
    run = issue_run("/srv/acme-app")
    body = pull_request_body(run, repo="acme/APP")
    lines = body.splitlines()
    assert lines.count("Closes #7") == 1
    assert (
        lines.index("Closes #7")
        == lines.index(next(x for x in lines if x.startswith("Task "))) + 2
    )
    # The issue's own words stay inert: only loopsweb's line acts.
    assert f"closes \\#{ZWJ}3" in body and f"@{ZWJ}octocat" in body
    assert f"Fixes #{ZWJ}4" in body and f"@{ZWJ}team" in body
    assert "Task `Acme/App#7`" in body
    title = pull_request_title(run)
    assert title == f"Fix it for @{ZWJ}octocat, closes #{ZWJ}3 and acme/app#{ZWJ}9"


@pytest.mark.django_db
@pytest.mark.parametrize("repo", [None, "", "acme/other", "other/app"])
def test_a_pull_request_in_another_repository_closes_nothing(repo: str | None) -> None:
    run = issue_run("/srv/acme-app")
    body = pull_request_body(run, repo=repo)
    assert "Closes" not in body.replace(f"closes \\#{ZWJ}3", "")


@pytest.mark.django_db
def test_a_task_from_another_source_closes_nothing_whatever_its_id() -> None:
    result = route_event(
        kind="todos-task",
        envelope=todos_event("acme/app#7", project="/srv/acme-app"),
        options=route_options({}),
        env={},
    )
    assert result.run is not None
    body = pull_request_body(result.run, repo="acme/app")
    assert "Closes" not in body


@pytest.mark.django_db
@pytest.mark.slow
def test_the_delivered_pull_request_says_closes(
    agent: FakeAgent, forge: Forge, tmp_path: Path
) -> None:
    """The issue as a task, run by the fake agent, delivered as a pull request to the
    GitHub stand-in: the body it received closes the issue."""
    project, _origin = project_with_origin(tmp_path)
    agent.configure(steps={"worker": {"write": "note.txt"}})
    run = issue_run(str(project), deliver="pull-request", github_repo="Acme/App")
    run_workflow_run(run.id)
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED
    [request] = forge.requests
    assert request["path"] == "/repos/Acme/App/pulls"
    text = request["body"]["body"]
    assert "\nCloses #7\n" in text and f"closes \\#{ZWJ}3" in text
    assert request["body"]["title"].startswith(f"Fix it for @{ZWJ}octocat")
