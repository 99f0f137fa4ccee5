"""A bad drain or schedule option is refused before the drain reads its first candidate
(issue 28 item 1): one clear error, exit 1, nothing written, no inbox row touched. A
required-worktree error on one candidate is a route error: skipped, the drain goes on (issue
29 item 2, docs/upstream.md §5)."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django_q.models import Schedule

from routing.drains import drain_options, drain_run
from routing.drains.inbox import inbox_ingest
from routing.models import DrainRecord, InboxEvent
from tests.ledger.runner_helpers import child_database_url
from tests.processes import manage
from tests.routing.api.helpers import row_counts
from tests.routing.helpers import generic_event, todos_event

pytestmark = pytest.mark.django_db


def _inbox() -> list[tuple[str, str, int]]:
    return sorted(InboxEvent.objects.values_list("id", "state", "route_attempts"))


BAD_DRAIN_OPTIONS = [
    (["--max-active-scope", "s" * 300], "route scope is longer than 200 characters"),
    (["--name-prefix", "n" * 600], "workflow name is longer than"),
    (["--project-group", "g" * 3000], "project group is longer than"),
    (["--project-path", "/srv/" + "p" * 3000], "project path is too long"),
    (["--project-path", "/etc"], "outside LOOPSWEB_PROJECT_ROOTS"),
    (["--auth-profile-pool", "a" * 201 + ",b"], "(at most 200 characters)"),
    # issue 43: each of these used to pass the drain and fail (or never match) its events
    (["--sandbox", "danger-full-access"], "needs --manual-break-glass"),
    (["--max-active-scope", "a\nb"], "--max-active-scope must not contain control"),
    (["--max-active-scope", "s\x1b[2J"], "--max-active-scope must not contain control"),
    (["--project-path-prefix", "relative"], "must be an absolute path"),
    (["--tags", "ok,\x1b]0;x\x07"], "--tags must not contain control"),
]


def test_a_blank_scope_still_falls_through_to_the_loop_name() -> None:
    drain = drain_options(
        "generic", {"max_active": 1, "max_active_scope": " "}, name="nightly"
    )
    assert drain.route.max_active_scope is None and drain.name == "nightly"
    pool = drain_options("generic", {"auth_profile_pool": "a,,b,"}).route
    assert pool.auth_profile_pool == ("a", "b")


@pytest.mark.parametrize(("args", "message"), BAD_DRAIN_OPTIONS)
def test_a_bad_drain_option_is_refused_before_any_candidate_is_read(
    args: list[str], message: str
) -> None:
    inbox_ingest(enumerate([generic_event() for _ in range(5)], start=1))
    before, inbox = row_counts(), _inbox()
    with pytest.raises(CommandError) as refused:
        call_command(
            "drain",
            "generic",
            *args,
            "--max-dispatch",
            "1",
            "--max-active",
            "5",
            stdout=io.StringIO(),
        )
    assert message in str(refused.value)
    assert row_counts() == before and _inbox() == inbox
    assert not DrainRecord.objects.exists()


def test_a_schedule_whose_name_makes_a_scope_too_long_is_refused_when_created() -> None:
    before = Schedule.objects.count()
    with pytest.raises(CommandError, match="route scope is longer than 200"):
        call_command(
            "schedule_drain",
            "n" * 300,
            "generic",
            "--every",
            "5m",
            stdout=io.StringIO(),
        )
    assert Schedule.objects.count() == before


def test_a_schedule_with_a_template_its_route_cannot_use_is_refused_when_created() -> (
    None
):
    with pytest.raises(CommandError, match="--template must be"):
        call_command(
            "schedule_drain",
            "reviews",
            "todos-task",
            "--template",
            "pr-review",
            "--every",
            "5m",
            stdout=io.StringIO(),
        )
    assert not Schedule.objects.filter(name="reviews").exists()


def test_drain_options_refuse_the_scope_a_drain_name_makes() -> None:
    from domain.errors import ValidationError

    with pytest.raises(ValidationError, match="route scope"):
        drain_options("generic", {"max_active": 1}, name="x" * 201)
    assert drain_options("generic", {"max_active": 1}, name="x" * 200).name


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_drain_command_refuses_a_bad_option_with_exit_1_and_one_line() -> None:
    """Through a real `manage.py drain` on the test database: exit 1, one line on stderr,
    no traceback, and no inbox row touched."""
    inbox_ingest(enumerate([generic_event() for _ in range(3)], start=1))
    inbox = _inbox()
    done = manage(
        {**os.environ, "DATABASE_URL": child_database_url()},
        "drain",
        "generic",
        "--max-active-scope",
        "s" * 300,
        "--max-dispatch",
        "1",
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "route scope is longer than 200 characters" in done.stderr
    assert "Traceback" not in done.stderr
    assert _inbox() == inbox
    assert not DrainRecord.objects.exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_schedule_drain_refuses_danger_full_access_when_created() -> None:
    """Through a real `manage.py schedule_drain`: the option that used to fail every
    pending event at each firing is refused at creation, exit 1, no schedule stored."""
    done = manage(
        {**os.environ, "DATABASE_URL": child_database_url()},
        "schedule_drain",
        "nightly",
        "generic",
        "--every",
        "5m",
        "--sandbox",
        "danger-full-access",
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "--sandbox danger-full-access needs --manual-break-glass" in done.stderr
    assert "Traceback" not in done.stderr
    assert not Schedule.objects.filter(name="nightly").exists()


# --- a required worktree is a route error, not a task error ------------------------------------


def test_a_required_worktree_error_in_a_drain_is_skipped_and_the_drain_goes_on(
    tmp_path: Path, settings: Any
) -> None:
    plain = tmp_path / "plain"  # a directory, not a git work tree
    plain.mkdir()
    settings.LOOPSWEB_PROJECT_ROOTS = [str(tmp_path), "/srv"]
    inbox_ingest(
        enumerate(
            [todos_event(project=str(plain)), todos_event(project=str(plain))], start=1
        )
    )
    report = drain_run(
        options=drain_options(
            "todos-task", {"worktree_mode": "required", "max_dispatch": 5}
        ),
        env={},
    )
    assert report.counts["fatal"] == 0 and report.counts["skipped"] == 2
    assert report.fatal == 0
    first = report.results[0]
    assert first["kind"] == "skipped" and first["routeError"] is True
    assert first["reason"].startswith(
        "worktreeMode=required but projectPath is not an existing git repository:"
    )
    assert "fatal" not in first
    assert set(InboxEvent.objects.values_list("state", flat=True)) == {"skipped"}


def test_the_drain_command_exits_0_on_a_required_worktree_error(
    tmp_path: Path, settings: Any
) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    settings.LOOPSWEB_PROJECT_ROOTS = [str(tmp_path), "/srv"]
    inbox_ingest(enumerate([todos_event(project=str(plain))], start=1))
    out = io.StringIO()
    call_command("drain", "todos-task", "--worktree-mode", "required", stdout=out)
    assert "skipped=1" in out.getvalue() and "fatal=0" in out.getvalue()
