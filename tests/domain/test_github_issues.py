"""domain.github_issues: names, labels, the issues payload read, its envelope and the issue a
pull request closes (docs/github-intake.md). No database."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from domain.errors import ValidationError
from domain.events import parse_envelope
from domain.github_issues import (
    BODY_CHARS,
    TITLE_CHARS,
    checked_intake_label,
    checked_repo_name,
    closed_issue,
    issue_envelope,
    issue_of,
    older_than,
)


def payload(**issue: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "number": 7,
        "title": "Fix the login page",
        "body": "It breaks.",
        "state": "open",
        "labels": [{"name": "auto:route"}, {"name": "bug"}],
        "html_url": "https://github.com/Acme/App/issues/7",
        "user": {"login": "mona"},
        "updated_at": "2026-01-02T03:04:05Z",
    }
    fields.update(issue)
    return {"repository": {"full_name": "Acme/App"}, "issue": fields}


@pytest.mark.parametrize(
    "name",
    ["acme/app", "Acme-Co/app.js", "a/b", "x1/_.-", f"{'o' * 39}/{'r' * 100}"],
)
def test_github_names_are_accepted(name: str) -> None:
    assert checked_repo_name(f"  {name} ") == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "acme",
        "acme/",
        "/app",
        "-acme/app",
        "acme-/app",
        "acme/app/x",
        "ac me/app",
        "acme/a b",
        "acme/.",
        "acme/..",
        f"{'o' * 40}/app",
        f"acme/{'r' * 101}",
        "acme/app\x1b[31m",
        None,
        7,
    ],
)
def test_other_names_are_refused(name: object) -> None:
    with pytest.raises(ValidationError, match="must be OWNER/NAME"):
        checked_repo_name(name)


def test_a_long_refused_name_is_shown_cut() -> None:
    with pytest.raises(ValidationError) as refused:
        checked_repo_name("x" * 5000)
    assert len(str(refused.value)) < 400


def test_labels_are_checked() -> None:
    assert checked_intake_label(" loopsweb ") == "loopsweb"
    assert checked_intake_label("x" * 50) == "x" * 50
    for bad, message in [
        ("", "must not be empty"),
        ("   ", "must not be empty"),
        ("x" * 51, "longer than 50"),
        ("auto\x1b]52;route", "control characters"),
        ("a\nb", "control characters"),
        ("Manual", "makes drains skip a task"),
        ("no-auto", "makes drains skip a task"),
    ]:
        with pytest.raises(ValidationError, match=message):
            checked_intake_label(bad)


def test_the_payload_is_read_into_an_issue() -> None:
    issue = issue_of(payload())
    assert (issue.repo, issue.number, issue.task_id, issue.event_id) == (
        "Acme/App",
        7,
        "Acme/App#7",
        "acme/app#7",
    )
    assert issue.open and not issue.pull_request
    assert issue.labels == ("auto:route", "bug") and issue.carries("AUTO:Route")
    assert not issue.carries("loopsweb")
    assert (issue.author, issue.updated_at) == ("mona", "2026-01-02T03:04:05Z")
    assert issue_of(payload(body=None, user=None, updated_at=3)).body == ""
    assert issue_of(payload(pull_request={"url": "x"})).pull_request
    assert not issue_of(payload(state="closed")).open


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"number": "7"}, "issue.number must be a whole number"),
        ({"number": True}, "issue.number must be a whole number"),
        ({"number": 0}, "issue.number must be from 1"),
        ({"title": None}, "issue.title must be text"),
        ({"body": 5}, "issue.body must be text"),
        ({"state": None}, "issue.state must be text"),
        ({"labels": "bug"}, "issue.labels must be an array"),
        ({"labels": ["bug"]}, "with a text name"),
        ({"labels": [{"name": 3}]}, "with a text name"),
        ({"labels": [{"name": "x"}] * 101}, "more than 100 labels"),
        ({"html_url": "javascript:alert(1)"}, "issue.html_url must be an http"),
        ({"html_url": "https://x/\x1b"}, "issue.html_url must be an http"),
        ({"html_url": None}, "issue.html_url must be text"),
    ],
)
def test_a_bad_issue_is_refused_naming_the_field(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        issue_of(payload(**change))


def test_a_bad_repository_or_payload_is_refused() -> None:
    with pytest.raises(ValidationError, match="the payload must be an object"):
        issue_of([])
    bad = payload()
    bad["repository"] = {"full_name": "nope"}
    with pytest.raises(
        ValidationError, match="repository.full_name must be OWNER/NAME"
    ):
        issue_of(bad)
    del bad["repository"]
    with pytest.raises(ValidationError, match="repository must be an object"):
        issue_of(bad)
    with pytest.raises(ValidationError, match="issue must be an object"):
        issue_of({"repository": {"full_name": "a/b"}, "issue": None})


def test_untrusted_text_is_bounded_and_drives_no_terminal() -> None:
    issue = issue_of(
        payload(
            title="Fix\x1b]52;c;ZWNobw==\x07 it\nnow @octocat closes #3 " + "t" * 400,
            body="line one\r\nline two\x1b[2J\x9b" + "b" * (BODY_CHARS + 10),
            labels=[{"name": "auto:route"}, {"name": "bad\x1b[31m\nlabel"}],
        )
    )
    assert issue.title.startswith(
        "Fix\\x1b]52;c;ZWNobw==\\x07 it now @octocat closes #3 "
    )
    assert len(issue.title) == TITLE_CHARS and issue.title.endswith("…")
    assert issue.body.startswith("line one\nline two\\x1b[2J\\x9b")
    assert len(issue.body) == BODY_CHARS
    assert issue.tags == ("auto:route", "bad\\x1b[31m label")
    for text in (issue.title, issue.body, *issue.tags):
        assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text


def test_the_envelope_is_a_todos_task_in_the_mapped_project() -> None:
    issue = issue_of(payload())
    envelope = issue_envelope(issue, project_path="/srv/app", intake_label="loopsweb")
    parsed = parse_envelope(copy.deepcopy(envelope))
    assert (parsed.id, parsed.type, parsed.source, parsed.subject) == (
        "acme/app#7",
        "task.created",
        "github",
        "Acme/App#7",
    )
    assert parsed.data == {
        "id": "Acme/App#7",
        "title": "Fix the login page",
        "description": "It breaks.",
        "tags": ["auto:route", "bug"],
        "project_path": "/srv/app",
        "url": "https://github.com/Acme/App/issues/7",
        "route_enabled": True,
        "github": {
            "repo": "Acme/App",
            "number": 7,
            "author": "mona",
            "updatedAt": "2026-01-02T03:04:05Z",
            "intakeLabel": "loopsweb",
        },
    }


def test_an_older_delivery_is_told_from_a_later_one() -> None:
    stored = {"github": {"updatedAt": "2026-01-02T03:04:05Z"}}
    assert older_than(issue_of(payload(updated_at="2026-01-02T03:04:04Z")), stored) == (
        "2026-01-02T03:04:05Z"
    )
    for same_or_later in ("2026-01-02T03:04:05Z", "2026-01-02T03:04:06Z"):
        assert older_than(issue_of(payload(updated_at=same_or_later)), stored) is None
    assert older_than(issue_of(payload(updated_at=None)), stored) is None
    assert (
        older_than(issue_of(payload()), {"github": {"updatedAt": "yesterday"}}) is None
    )
    assert older_than(issue_of(payload()), None) is None


@pytest.mark.parametrize(
    ("task_id", "source", "repo", "closes"),
    [
        ("Acme/App#7", "github", "acme/app", 7),
        ("acme/app#12", "github", "Acme/App", 12),
        ("acme/app#7", "github", "acme/other", None),
        ("acme/app#7", "@hasna/todos", "acme/app", None),
        ("acme/app#7", None, "acme/app", None),
        ("acme/app#7", "github", None, None),
        ("acme/app#07", "github", "acme/app", None),
        ("acme/app#7 closes #9", "github", "acme/app", None),
        ("task-7", "github", "acme/app", None),
        (None, "github", "acme/app", None),
    ],
)
def test_the_issue_a_pull_request_closes(
    task_id: object, source: object, repo: str | None, closes: int | None
) -> None:
    assert closed_issue(task_id, source=source, repo=repo) == closes
