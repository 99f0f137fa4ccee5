"""The `--deliver` route options (issue 40): one validator for argv, schedules and the API;
bad values are one clear error and write nothing; a schedule keeps them; the item stores
them for the runner and `routes show`."""

from __future__ import annotations

import ast
import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django_q.models import Schedule

from domain.errors import ValidationError
from ledger.models import WorkflowInvocation, WorkflowWorkItem
from routing.admission import route_options
from tests.routing.helpers import todos_event

pytestmark = pytest.mark.django_db


def test_the_defaults_are_todays_behaviour_and_are_not_recorded() -> None:
    options = route_options({})
    assert (options.deliver, options.deliver_remote) == ("branch", "origin")
    assert options.deliver_failed is False and options.github_repo is None
    assert not {"deliver", "deliver_remote", "deliver_failed", "github_repo"} & set(
        options.to_dict()
    )
    chosen = route_options(
        {
            "deliver": "pull-request",
            "deliver_remote": "upstream",
            "deliver_failed": True,
            "github_repo": "acme/widgets",
            "github_reviewer": " octo-cat,Mona ,octo-cat",
        }
    )
    assert chosen.github_reviewer == ("octo-cat", "Mona")
    assert chosen.to_dict() == {
        "provider": "codewith",
        "deliver": "pull-request",
        "deliver_remote": "upstream",
        "deliver_failed": True,
        "github_repo": "acme/widgets",
        "github_reviewer": "octo-cat,Mona",
    }
    # What a stored route says reads back as the same options.
    assert route_options(chosen.to_dict()) == chosen
    assert route_options({}).github_reviewer == ()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"deliver": "merge"},
            "--deliver must be one of none, branch, push, pull-request",
        ),
        (
            {"deliver_remote": "-oProxyCommand=x"},
            "--deliver-remote must be a git remote name",
        ),
        ({"deliver_remote": "a..b"}, "--deliver-remote must be a git remote name"),
        ({"github_repo": "acme"}, "--github-repo must be OWNER/NAME"),
        ({"github_repo": "acme/../x"}, "--github-repo must be OWNER/NAME"),
        ({"deliver_failed": "yes"}, "--deliver-failed must be a boolean"),
        ({"github_reviewer": "-mona"}, "--github-reviewer must be GitHub logins"),
        ({"github_reviewer": "mo--na"}, "'mo--na' is not one"),
        ({"github_reviewer": "mona-"}, "--github-reviewer must be GitHub logins"),
        ({"github_reviewer": "a" * 40}, "--github-reviewer must be GitHub logins"),
        ({"github_reviewer": "mona,,hub"}, "'' is not one"),
        ({"github_reviewer": "mona;rm"}, "--github-reviewer must be GitHub logins"),
        ({"github_reviewer": 7}, "--github-reviewer must be a string"),
    ],
)
def test_bad_values_are_refused_by_the_one_validator(raw: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        route_options(raw)


def _route_task(task_id: str, *argv: str) -> str:
    """`route_event todos-task` of a new task with `argv`: what it printed."""
    out = io.StringIO()
    call_command(
        "route_event",
        "todos-task",
        "--event-json",
        json.dumps(todos_event(task_id)),
        *argv,
        stdout=out,
    )
    return out.getvalue()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--deliver", "yolo"), "--deliver must be one of"),
        (("--github-reviewer", "mona,octo_cat"), "'octo_cat' is not one"),
    ],
)
def test_route_event_refuses_a_bad_delivery_option_and_writes_nothing(
    argv: tuple[str, ...], message: str
) -> None:
    with pytest.raises(CommandError, match=message):
        _route_task("task-d1", *argv)
    assert WorkflowWorkItem.objects.count() == WorkflowInvocation.objects.count() == 0


def test_the_item_stores_the_delivery_options_and_routes_show_prints_them() -> None:
    out = io.StringIO()
    call_command(
        "route_event",
        "todos-task",
        "--event-json",
        json.dumps(todos_event("task-d2")),
        "--deliver",
        "push",
        "--deliver-remote",
        "fork",
        "--json",
        stdout=out,
    )
    item_id = WorkflowWorkItem.objects.get().id
    item = WorkflowWorkItem.objects.get(pk=item_id)
    stored = item.route_options_json["options"]
    assert stored["deliver"] == "push" and stored["deliver_remote"] == "fork"
    out = io.StringIO()
    call_command("routes", "show", item_id, stdout=out)
    assert "deliver push (remote fork)" in out.getvalue()


def test_github_reviewer_is_stored_with_the_route_and_routes_show_prints_it() -> None:
    _route_task(
        "task-r1", "--deliver", "pull-request", "--github-reviewer", "mona,hubot"
    )
    item = WorkflowWorkItem.objects.get()
    assert item.route_options_json["options"]["github_reviewer"] == "mona,hubot"
    out = io.StringIO()
    call_command("routes", "show", item.id, stdout=out)
    assert (
        "deliver pull-request (remote origin, reviewers mona,hubot)" in out.getvalue()
    )
    out = io.StringIO()
    call_command("routes", "show", item.id, "--json", stdout=out)
    shown = json.loads(out.getvalue())["deliver"]
    assert shown["githubReviewers"] == ["mona", "hubot"]


def test_a_schedule_keeps_the_delivery_options() -> None:
    call_command(
        "schedule_drain",
        "prs",
        "todos-task",
        "--every",
        "1h",
        "--deliver",
        "pull-request",
        "--github-repo",
        "acme/widgets",
        stdout=io.StringIO(),
    )
    kwargs = ast.literal_eval(Schedule.objects.get(name="prs").kwargs)
    assert kwargs["options"]["deliver"] == "pull-request"
    assert kwargs["options"]["github_repo"] == "acme/widgets"
    with pytest.raises(CommandError, match="--deliver must be one of"):
        call_command(
            "schedule_drain",
            "bad",
            "todos-task",
            "--every",
            "1h",
            "--deliver",
            "x",
            stdout=io.StringIO(),
        )
    assert not Schedule.objects.filter(name="bad").exists()
