"""`manage.py repo` and the admin's GitHub repositories: one check, nothing written on bad
input (docs/github-intake.md §1)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from routing.models import GithubRepo

pytestmark = pytest.mark.django_db


def repo(*argv: str) -> str:
    out = io.StringIO()
    call_command("repo", *argv, stdout=out)
    return out.getvalue()


def repo_json(*argv: str) -> Any:
    return json.loads(repo(*argv, "--json"))


def rows() -> list[tuple[str, str, str]]:
    return list(
        GithubRepo.objects.order_by("full_name").values_list(
            "full_name", "project_path", "intake_label"
        )
    )


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A git checkout inside the roots (the suite's temporary directory is one)."""
    project = tmp_path / "acme-app"
    (project / ".git").mkdir(parents=True)
    return project


def test_add_list_and_remove(checkout: Path) -> None:
    said = repo("add", "acme/app", "--project-path", str(checkout / "src"))
    # The project kept is the one a route works in: the git work tree's top level.
    assert (
        said.strip()
        == f"repo: added acme/app -> {checkout} (intake label 'auto:route')"
    )
    assert rows() == [("acme/app", str(checkout), "auto:route")]
    repo("add", "Octo/Cat", "--project-path", "/srv/octo", "--intake-label", "loopsweb")
    listed = repo_json("list")
    assert [(r["fullName"], r["projectPath"], r["intakeLabel"]) for r in listed] == [
        ("Octo/Cat", "/srv/octo", "loopsweb"),
        ("acme/app", str(checkout), "auto:route"),
    ]
    assert "acme/app" in repo("list") and "label='loopsweb'" in repo("list")
    assert repo("remove", "ACME/APP").strip() == f"repo: removed acme/app ({checkout})"
    assert rows() == [("Octo/Cat", "/srv/octo", "loopsweb")]
    repo("remove", "octo/cat")
    assert repo("list").strip().startswith("repo: no repositories mapped")
    assert repo_json("list") == []


def test_json_and_dry_run_write_nothing() -> None:
    value = repo_json("add", "acme/app", "--project-path", "/srv/app", "--dry-run")
    assert value["result"] == "would add" and value["dryRun"] is True
    assert (
        value["repo"]["fullName"] == "acme/app" and value["repo"]["createdAt"] is None
    )
    assert rows() == []
    repo("add", "acme/app", "--project-path", "/srv/app")
    value = repo_json("remove", "acme/app", "--dry-run")
    assert (
        value["result"] == "would remove" and value["repo"]["projectPath"] == "/srv/app"
    )
    assert rows() == [("acme/app", "/srv/app", "auto:route")]
    dry = repo("add", "acme/app", "--project-path", "/srv/b", "--update", "--dry-run")
    assert dry.startswith("repo: would update acme/app -> /srv/b")
    assert rows() == [("acme/app", "/srv/app", "auto:route")]


def test_adding_a_mapped_repository_again_needs_update() -> None:
    repo("add", "acme/app", "--project-path", "/srv/app", "--intake-label", "go")
    with pytest.raises(CommandError) as refused:
        repo("add", "Acme/App", "--project-path", "/srv/other")
    assert str(refused.value) == (
        "repository acme/app is mapped already (to /srv/app): change that mapping "
        "instead (repo add --update, or its admin page)"
    )
    assert rows() == [("acme/app", "/srv/app", "go")]
    value = repo_json("add", "Acme/App", "--project-path", "/srv/other", "--update")
    assert value["result"] == "updated"
    # The label stays unless given; the name takes the case given.
    assert rows() == [("Acme/App", "/srv/other", "go")]
    same = repo_json("add", "acme/app", "--project-path", "/srv/other", "--update")
    assert same["result"] == "updated" and rows()[0][0] == "acme/app"
    unchanged = repo_json("add", "acme/app", "--project-path", "/srv/other", "--update")
    assert unchanged["result"] == "unchanged"
    new = repo_json("add", "new/one", "--project-path", "/srv/new", "--update")
    assert new["result"] == "added" and len(rows()) == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["add", "acme", "--project-path", "/srv/app"], "must be OWNER/NAME"),
        (["add", "acme-/app", "--project-path", "/srv/app"], "must be OWNER/NAME"),
        (["add", "acme/a b", "--project-path", "/srv/app"], "must be OWNER/NAME"),
        (
            ["add", "acme/app", "--project-path", "/etc"],
            "outside LOOPSWEB_PROJECT_ROOTS",
        ),
        (["add", "acme/app", "--project-path", "srv/app"], "must be an absolute path"),
        (["add", "acme/app", "--project-path", "/srv/../etc"], "'..'"),
        (["add", "acme/app", "--project-path", ""], "no project path"),
        (
            ["add", "acme/app", "--project-path", "/srv/app", "--intake-label", ""],
            "must not be empty",
        ),
        (
            [
                "add",
                "acme/app",
                "--project-path",
                "/srv/app",
                "--intake-label",
                "x" * 51,
            ],
            "longer than 50",
        ),
        (
            ["add", "a/b", "--project-path", "/srv/app", "--intake-label", "x\x1b[2Jy"],
            "control characters",
        ),
        (
            ["add", "a/b", "--project-path", "/srv/app", "--intake-label", "no-auto"],
            "makes drains skip a task",
        ),
        (["remove", "acme/missing"], "no repository acme/missing is mapped"),
        (
            ["remove", "acme/missing", "--dry-run"],
            "no repository acme/missing is mapped",
        ),
        (["remove", "x\x1b]52;y"], "must be OWNER/NAME"),
    ],
)
def test_bad_input_is_one_error_and_writes_nothing(
    argv: list[str], message: str
) -> None:
    with pytest.raises(CommandError, match=message):
        repo(*argv)
    assert rows() == []


def test_a_path_outside_the_hosts_roots_is_refused(settings: Any) -> None:
    settings.LOOPSWEB_PROJECT_ROOTS = []
    with pytest.raises(CommandError, match="no project roots are configured"):
        repo("add", "acme/app", "--project-path", "/srv/app")
    assert rows() == []


# --- the admin ----------------------------------------------------------------------------------


def test_the_admin_lists_adds_edits_and_deletes_with_the_command_s_check(
    admin_client: Any, checkout: Path
) -> None:
    add = reverse("admin:routing_githubrepo_add")
    refused = admin_client.post(
        add,
        {"full_name": "acme", "project_path": "/etc", "intake_label": "auto:route"},
    )
    assert refused.status_code == 200 and rows() == []
    page = refused.content.decode()
    assert "must be OWNER/NAME" in page
    for project, label, said in [
        ("/etc", "auto:route", "outside LOOPSWEB_PROJECT_ROOTS"),
        ("/srv/app", "manual", "makes drains skip a task"),
        ("/srv/app", "a\x1b[2Jb", "control characters"),
    ]:
        page = admin_client.post(
            add,
            {"full_name": "acme/app", "project_path": project, "intake_label": label},
        ).content.decode()
        assert said in page
    assert rows() == []
    created = admin_client.post(
        add,
        {
            "full_name": " acme/app ",
            "project_path": str(checkout / "src"),
            "intake_label": "auto:route",
        },
    )
    assert created.status_code == 302
    assert rows() == [("acme/app", str(checkout), "auto:route")]
    again = admin_client.post(
        add,
        {
            "full_name": "ACME/app",
            "project_path": "/srv/x",
            "intake_label": "auto:route",
        },
    )
    assert "is mapped already" in again.content.decode() and len(rows()) == 1
    row = GithubRepo.objects.get()
    listing = admin_client.get(reverse("admin:routing_githubrepo_changelist"))
    assert listing.status_code == 200 and "acme/app" in listing.content.decode()
    change = reverse("admin:routing_githubrepo_change", args=[row.pk])
    edited = admin_client.post(
        change,
        {"full_name": "acme/app", "project_path": "/srv/moved", "intake_label": "go"},
    )
    assert edited.status_code == 302
    assert rows() == [("acme/app", "/srv/moved", "go")]
    delete = reverse("admin:routing_githubrepo_delete", args=[row.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 302
    assert rows() == []


def test_the_admin_escapes_what_it_shows(admin_client: Any) -> None:
    GithubRepo.objects.create(
        full_name="acme/app", project_path="/srv/<script>alert(1)</script>"
    )
    page = admin_client.get(reverse("admin:routing_githubrepo_changelist")).content
    assert b"<script>alert(1)" not in page and b"&lt;script&gt;" in page


def test_anonymous_users_are_sent_to_the_login_page(client: Any) -> None:
    response = client.get(reverse("admin:routing_githubrepo_changelist"))
    assert response.status_code == 302 and "/login/" in response["Location"]
