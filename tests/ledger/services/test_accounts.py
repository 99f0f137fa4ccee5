"""The account registry: `manage.py account` (in-process and as a process), the checks
that keep secrets out of it, the admin."""

from __future__ import annotations

import io
import json
import os
import subprocess

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from ledger.models import Account
from tests.ledger.runner_helpers import child_database_url
from tests.processes import manage


def _account(*args: str) -> str:
    out = io.StringIO()
    call_command("account", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.mark.django_db
def test_add_list_disable_enable_remove() -> None:
    assert "added acctA (codex)" in _account(
        "add",
        "acctA",
        "--provider",
        "codex",
        "--env",
        "CODEX_HOME=/srv/a/codex",
        "--max-running",
        "2",
        "--notes",
        "team A",
    )
    _account(
        "add", "acctB", "--provider", "claude", "--env", "CLAUDE_CONFIG_DIR=/srv/b"
    )
    listed = json.loads(_account("list", "--json"))
    assert [
        (e["name"], e["provider"], e["enabled"], e["maxRunning"], e["env"])
        for e in listed
    ] == [
        ("acctA", "codex", True, 2, {"CODEX_HOME": "/srv/a/codex"}),
        ("acctB", "claude", True, None, {"CLAUDE_CONFIG_DIR": "/srv/b"}),
    ]
    assert (
        "acctA  provider=codex  enabled  max_running=2  env=CODEX_HOME=/srv/a/codex"
        in _account("list")
    )

    assert _account("disable", "acctA").strip() == "account: disabled acctA"
    assert _account("disable", "acctA").strip() == "account: already disabled acctA"
    assert not Account.objects.get(pk="acctA").enabled
    assert json.loads(_account("enable", "acctA", "--json"))["result"] == "enabled"

    assert (
        _account("remove", "acctB", "--dry-run").strip()
        == "account: would remove acctB"
    )
    assert Account.objects.filter(pk="acctB").exists()
    assert _account("remove", "acctB").strip() == "account: removed acctB"
    assert list(Account.objects.values_list("pk", flat=True)) == ["acctA"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "OPENAI_API_KEY=sk-1"], "looks like a secret"),
        (["--env", "GH_TOKEN=x"], "looks like a secret"),
        (["--env", "DB_PASSWORD_FILE=/x"], "looks like a secret"),
        (["--env", "LOOPSWEB_CODEX_BIN=/x"], "loopsweb's own"),
        (["--env", "DATABASE_URL=sqlite:///x"], "loopsweb's own"),
        (["--env", "1BAD=x"], "not a variable name"),
        (["--env", "NOVALUE"], "KEY=VALUE"),
        (["--env", "CODEX_HOME=/a\nb"], "line break"),
        (["--max-running", "0"], "positive integer"),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        _account("add", "acctA", "--provider", "codex", *args)
    assert not Account.objects.exists()


@pytest.mark.django_db
def test_a_name_that_could_read_as_a_flag_or_an_existing_name_is_refused() -> None:
    with pytest.raises(CommandError, match="not valid"):
        _account("add", "--provider", "codex", "--", "--config=/tmp/evil")
    _account("add", "acctA", "--provider", "codex")
    with pytest.raises(CommandError, match="already exists"):
        _account("add", "acctA", "--provider", "claude")
    with pytest.raises(CommandError, match="no account named"):
        _account("disable", "nobody")
    assert Account.objects.get(pk="acctA").provider == "codex"


@pytest.mark.django_db
def test_add_dry_run_writes_nothing() -> None:
    out = _account("add", "acctA", "--provider", "codex", "--dry-run")
    assert "would add acctA" in out and not Account.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_the_command_as_a_process_adds_lists_and_refuses_secrets() -> None:
    env = dict(os.environ, DATABASE_URL=child_database_url())

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return manage(env, "account", *args, check=False)

    added = run("add", "acctA", "--provider", "codex", "--env", "CODEX_HOME=/srv/a")
    assert added.returncode == 0, added.stderr
    refused = run("add", "acctB", "--provider", "codex", "--env", "ANTHROPIC_API_KEY=x")
    assert refused.returncode == 1 and "looks like a secret" in refused.stderr
    listed = run("list", "--json")
    assert [e["name"] for e in json.loads(listed.stdout)] == ["acctA"]


@pytest.mark.django_db
def test_the_admin_lists_adds_and_refuses_a_secret(admin_client) -> None:
    Account.objects.create(
        name="acctA", provider="codex", env_json={"CODEX_HOME": "/srv/a"}
    )
    page = admin_client.get("/admin/ledger/account/")
    assert page.status_code == 200 and b"CODEX_HOME=/srv/a" in page.content
    assert admin_client.get("/admin/ledger/account/acctA/change/").status_code == 200
    bad = admin_client.post(
        "/admin/ledger/account/add/",
        {
            "name": "acctB",
            "provider": "codex",
            "enabled": "on",
            "env_json": '{"OPENAI_API_KEY": "sk"}',
            "notes": "",
        },
    )
    assert bad.status_code == 200 and b"looks like a secret" in bad.content
    good = admin_client.post(
        "/admin/ledger/account/add/",
        {
            "name": "acctB",
            "provider": "claude",
            "enabled": "on",
            "env_json": '{"CLAUDE_CONFIG_DIR": "/srv/b"}',
            "notes": "",
        },
    )
    assert good.status_code == 302
    assert Account.objects.get(pk="acctB").env_json == {"CLAUDE_CONFIG_DIR": "/srv/b"}
