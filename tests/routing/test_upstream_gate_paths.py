"""Upstream parity (the PR review gate, dedupe before worktree checks, the project path order) through `route_event` and `drain` with upstream's
exact strings (docs/upstream.md §3.2.9-11, §5.1): the PR review gate's reviewer, a replayed
task under `--worktree-mode required` with `--project-path`, and a drained task's project in
upstream's order. The pure rules' tables: tests/domain/test_review.py,
tests/domain/test_drained_path.py."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from domain.review import AUTHOR_MISSING, REVIEWER_MISSING, SELF_REVIEW
from ledger.models import WorkflowWorkItem
from routing.drains.inbox import inbox_ingest
from routing.drains.routable import never_routable
from routing.models import InboxEvent
from tests.routing.api.helpers import row_counts
from tests.routing.helpers import plain_project, todos_event

pytestmark = pytest.mark.django_db

URL = "https://github.com/acme/app/pull/9"
REQUIRED_NOT_GIT = (
    "worktreeMode=required but projectPath is not an existing git repository: {path}"
)


def _route_text(event: dict[str, Any], *args: str) -> str:
    out = io.StringIO()
    call_command(
        "route_event",
        "todos-task",
        "--event-json",
        json.dumps(event),
        *args,
        stdout=out,
    )
    return out.getvalue()


def _route(event: dict[str, Any], *args: str) -> dict[str, Any]:
    return json.loads(_route_text(event, *args, "--json"))


def _drain(*args: str) -> dict[str, Any]:
    out = io.StringIO()
    call_command("drain", "todos-task", *args, "--json", stdout=out)
    return json.loads(out.getvalue())


def _review_task(
    task_id: str, author: str | None = "mona", **data: Any
) -> dict[str, Any]:
    said = f"The author is {author}. " if author else ""
    return todos_event(
        task_id,
        title="Review and merge acme/app#9",
        description=f"{said}CI is green; please merge {URL}",
        **data,
    )


# --- item 11: the PR review gate needs a reviewer who is not the PR's author --------------------


@pytest.mark.parametrize(
    ("author", "args", "reason"),
    [
        (None, ["--github-reviewer", "hubot"], AUTHOR_MISSING),
        ("mona", [], REVIEWER_MISSING),
        ("mona", ["--github-reviewer", "Mona"], SELF_REVIEW.format(author="mona")),
    ],
    ids=["no author", "no reviewer", "self-review"],
)
def test_a_review_task_without_a_non_author_reviewer_is_skipped_with_upstreams_reason(
    author: str | None, args: list[str], reason: str
) -> None:
    before = row_counts()
    result = _route(_review_task("PR-1", author), *args)
    assert result["kind"] == "skipped" and result["skipped"] is True
    assert result["reason"] == reason
    assert result["routeError"] is True and "freshnessSkip" not in result
    routing = result["prReviewRouting"]
    assert routing["required"] is True and routing["allowed"] is False
    assert routing["reason"] == reason and routing["pr"] == "acme/app#9"
    assert "pr-approval-intent" in routing["signals"]
    assert row_counts() == before  # nothing written
    # The human line, exit 0 (no CommandError).
    line = _route_text(_review_task("PR-1", author), *args)
    assert line.strip() == f"skipped task PR-1: {reason}"


@pytest.mark.parametrize(
    ("args", "data", "selected"),
    [
        (["--github-reviewer", "mona,hubot"], {}, "hubot"),
        ([], {"github_reviewer": "octo"}, "octo"),
        ([], {"metadata": {"github_reviewer_pool": "mona, @octo"}}, "octo"),
    ],
    ids=["--github-reviewer", "a task field", "the task's metadata pool"],
)
def test_a_review_task_with_a_non_author_reviewer_is_admitted_with_its_reviewer(
    args: list[str], data: dict[str, Any], selected: str
) -> None:
    result = _route(_review_task("PR-2", **data), *args)
    assert result["kind"] == "created"
    routing = result["prReviewRouting"]
    assert routing["allowed"] is True and routing["selectedReviewer"] == selected
    assert routing["author"] == "mona" and routing["authorSource"] == "task"
    item = WorkflowWorkItem.objects.get(pk=result["workItem"]["id"])
    assert item.invocation.scope_json["prReviewRouting"] == routing


def test_reviewers_named_in_the_text_count_and_a_task_with_no_intent_has_no_gate() -> (
    None
):
    named = _review_task("PR-3")
    named["data"]["description"] += "\nGitHub reviewers: mona, hubot"
    assert _route(named)["prReviewRouting"]["selectedReviewer"] == "hubot"
    # A PR (another one: the same PR is the same item), no review or merge word.
    plain = todos_event("PR-4", title="Look at https://github.com/acme/app/pull/10")
    result = _route(plain)
    assert result["kind"] == "created" and "prReviewRouting" not in result


def test_a_drain_skips_the_review_task_without_a_reviewer_and_goes_on() -> None:
    inbox_ingest(enumerate([_review_task("PR-5"), todos_event("PR-6")], start=1))
    report = _drain("--max-dispatch", "5")
    by_task = {r["taskId"]: r for r in report["results"]}
    assert by_task["PR-5"]["kind"] == "skipped"
    assert by_task["PR-5"]["reason"] == REVIEWER_MISSING
    assert by_task["PR-5"]["routeError"] is True
    assert by_task["PR-6"]["kind"] == "created"
    assert report["fatal"] == 0 and report["freshnessClosed"] == 0
    states = dict(InboxEvent.objects.values_list("event_id", "state"))
    assert states == {"evt-PR-5": "skipped", "evt-PR-6": "admitted"}


def test_ingest_does_not_call_a_review_task_without_a_reviewer_never_routable(
    tmp_path: Path,
) -> None:
    """A drain's --github-reviewer may supply its reviewer; a merged PR never routes."""
    merged = _review_task("PR-7")
    merged["data"]["description"] += " pr_state=MERGED"
    items = [("item 1", _review_task("PR-8")), ("item 2", merged)]
    warnings = never_routable(items, cwd=str(tmp_path))
    assert [(w["at"], w["warning"]) for w in warnings] == [
        ("item 2", "PR is already merged; skipping merge/review route (freshness gate)")
    ]


# --- item 12: a replayed task under --worktree-mode required is deduped ----------------------


@pytest.fixture
def plain(tmp_path: Path, settings: Any) -> Path:
    return plain_project(tmp_path, settings)


def _pathless(task_id: str) -> dict[str, Any]:
    event = todos_event(task_id)
    del event["data"][
        "project_path"
    ]  # the task names none: --project-path is its project
    return event


def test_a_replayed_task_routed_by_project_path_with_worktree_required_is_deduped(
    plain: Path,
) -> None:
    event = _pathless("W-1")
    created = _route(event, "--project-path", str(plain))
    assert created["kind"] == "created"
    before = row_counts()
    replay = _route(event, "--project-path", str(plain), "--worktree-mode", "required")
    assert replay["kind"] == "deduped" and replay["dedupedBy"] == "work-item"
    assert replay["workItem"]["id"] == created["workItem"]["id"]
    assert row_counts() == before
    # A new task there is refused, after its early dedupe found nothing, writing nothing.
    with pytest.raises(CommandError) as refused:
        _route(
            _pathless("W-2"),
            "--project-path",
            str(plain),
            "--worktree-mode",
            "required",
        )
    assert str(refused.value) == REQUIRED_NOT_GIT.format(path=plain)
    assert row_counts() == before


def test_a_drain_with_such_a_project_path_dedupes_and_skips_instead_of_refusing(
    plain: Path,
) -> None:
    routed, fresh = _pathless("W-3"), _pathless("W-4")
    first = _route(routed, "--project-path", str(plain))
    inbox_ingest(enumerate([routed, fresh], start=1))
    report = _drain(
        "--project-path",
        str(plain),
        "--worktree-mode",
        "required",
        "--max-dispatch",
        "5",
    )
    by_task = {r["taskId"]: r for r in report["results"]}
    assert by_task["W-3"]["kind"] == "deduped"
    assert by_task["W-3"]["loop"]["id"] == first["loop"]["id"]
    assert by_task["W-4"]["kind"] == "skipped" and by_task["W-4"]["routeError"] is True
    assert by_task["W-4"]["reason"] == REQUIRED_NOT_GIT.format(path=plain)
    assert report["fatal"] == 0


def test_a_generic_route_is_still_refused_on_such_a_project_path(plain: Path) -> None:
    """A generic route's --project-path is every event's project and it has no early
    dedupe: the option is refused before any event is read."""
    with pytest.raises(CommandError) as refused:
        call_command(
            "route_event",
            "generic",
            "--event-json",
            json.dumps({"id": "g", "type": "x", "source": "ci", "data": {}}),
            "--project-path",
            str(plain),
            "--worktree-mode",
            "required",
            stdout=io.StringIO(),
        )
    assert str(refused.value) == REQUIRED_NOT_GIT.format(path=plain)


# --- item 13: a drained task's project in upstream's order --------------------------------------


def test_the_drain_filters_and_routes_a_task_on_its_project_in_upstreams_order(
    tmp_path: Path, settings: Any
) -> None:
    settings.LOOPSWEB_PROJECT_ROOTS = [str(tmp_path)]
    for name in ("wd", "line", "meta"):  # each a work tree: it normalizes to itself
        (tmp_path / name / ".git").mkdir(parents=True)
    by_line = todos_event(
        "P-1",
        working_dir=str(tmp_path / "wd"),
        description=f"Do it.\nRepository: {tmp_path / 'line'}\n",
    )
    by_meta = todos_event(
        "P-2",
        workingDir=str(tmp_path / "wd"),
        metadata={"project_path": str(tmp_path / "meta")},
    )
    by_wd = todos_event("P-3", working_dir=str(tmp_path / "wd"))
    for event in (by_line, by_meta, by_wd):
        del event["data"]["project_path"]
    inbox_ingest(enumerate([by_line, by_meta, by_wd], start=1))
    projects: dict[str, str] = {}
    for prefix in ("line", "meta", "wd"):
        report = _drain(
            "--project-path-prefix", str(tmp_path / prefix), "--max-dispatch", "5"
        )
        [result] = report["results"]
        assert result["kind"] == "created", prefix
        assert result["workItem"]["projectKey"] == str(tmp_path / prefix)
        assert result["task"]["projectPath"] == str(tmp_path / prefix)
        projects[result["taskId"]] = prefix
    assert projects == {"P-1": "line", "P-2": "meta", "P-3": "wd"}
    # Routed as delivered (docs/upstream.md §3.2.3), the task's working_dir comes first.
    direct = todos_event(
        "P-4",
        working_dir=str(tmp_path / "wd"),
        description=f"Repository: {tmp_path / 'line'}",
    )
    del direct["data"]["project_path"]
    assert _route(direct)["workItem"]["projectKey"] == str(tmp_path / "wd")
