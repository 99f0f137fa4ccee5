"""The /ops/ pages with many accounts and idle schedules, through
Django's test client as a staff user: the accounts page's filter and grouping, a drain's cap
over items admitted without one, idle drains folded, a patch's control characters shown,
and the pure helpers behind them. The layout at 1400 px: test_browser_fit.py."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from ledger.models import RunStatus, WorkflowRun
from routing.ops.display import (
    LABEL_MOST_CHARS,
    LABEL_MOST_W,
    LABEL_W,
    chart_label,
    label_width,
    visible_controls,
)
from tests.ledger.runner_helpers import git, git_project
from tests.routing.helpers import generic_event, route
from tests.routing.ops import crowd

pytestmark = pytest.mark.django_db


def section(html: str, name: str) -> str:
    return html.split(f'id="{name}"')[1].split("</section>")[0]


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.content[:2000]
    return response.content.decode()


def account_rows(html: str) -> list[str]:
    """The names of the accounts with a row of their own in the accounts table."""
    if 'id="table"' not in html:
        return []
    table = section(html, "table")
    return re.findall(
        r'<tr id="account-\d+">\s*<td class="account"><code>([^<]+)', table
    )


def test_the_accounts_page_groups_folds_filters_and_greys_expired_windows(
    admin_client: Client,
) -> None:
    seeded = crowd.crowded()
    html = page(admin_client, reverse("ops:accounts"))
    assert account_rows(html) == sorted(seeded.cooling, key=lambda n: (n[:5], n))
    groups = re.findall(r'<th colspan="12" scope="rowgroup">([^<]+) <span', html)
    assert groups == ["claude", "codex", "opencode"]
    folded = section(html, "table").split('class="folded-accounts"')[1:]
    assert len(folded) == 3 and all("4 free, nothing to note" in f for f in folded)
    assert 'href="?provider=codex"' in html and 'href="?state=cooling"' in html
    # The runner's 429 window reset 9 minutes ago: expired, in grey, not a red badge.
    windows = section(html, "windows").split('<tr class="window-row"')[1:]
    expired = [r for r in windows if r.startswith(" data-expired")]
    assert len(expired) == 1 and seeded.expired_window_account in expired[0]
    assert "badge full" not in expired[0] and "was rejected" in expired[0]
    assert "reset 9 min" in expired[0]

    codex = page(admin_client, reverse("ops:accounts") + "?provider=codex")
    assert account_rows(codex) == [n for n in sorted(seeded.cooling) if "codex" in n]
    assert re.findall(r'scope="rowgroup">([^<]+) <span', codex) == ["codex"]
    assert section(codex, "windows").count('class="window-row"') == 8

    # A state asked for shows each of its accounts in full, none folded.
    free = page(admin_client, reverse("ops:accounts") + "?state=free&provider=claude")
    assert len(account_rows(free)) == 4 and 'class="folded-accounts"' not in free
    assert seeded.expired_window_account in account_rows(free)

    # An unknown state is said in words; the page then shows every account.
    bad = page(admin_client, reverse("ops:accounts") + "?state=%3Cb%3Enope")
    assert 'id="filter-error"' in bad
    assert "There is no account state &#x27;&lt;b&gt;nope&#x27;" in bad
    assert account_rows(bad) == account_rows(html)
    nobody = page(admin_client, reverse("ops:accounts") + "?provider=cursor")
    assert 'id="no-match"' in nobody and account_rows(nobody) == []


def test_a_drains_cap_is_red_only_over_what_was_admitted_under_a_cap(
    admin_client: Client,
) -> None:
    crowd.crowded()
    scopes = section(page(admin_client, reverse("ops:overview")), "scopes")
    api = scopes.split(f"<code>{crowd.API_SCOPE}</code>")[1].split("</tr>")[0]
    assert "3 / 1" in api and "3 of them admitted without a cap" in api
    assert "full" not in api


def test_a_scope_a_drain_filled_stays_red(admin_client: Client) -> None:
    from routing.drains import drain_options, drain_run
    from routing.drains.inbox import inbox_ingest

    inbox_ingest(
        enumerate([generic_event(project=f"/srv/d{i}") for i in range(2)], start=1)
    )
    options = drain_options("generic", {"max_active": 1}, name="nightly")
    assert drain_run(options=options, env={}).counts["created"] == 1
    route(event=generic_event(project="/srv/api-extra"), max_active_scope="nightly")
    scopes = section(page(admin_client, reverse("ops:overview")), "scopes")
    row = scopes.split("<code>nightly</code>")[1].split("</tr>")[0]
    assert "2 / 1" in row and 'class="full"' in row
    assert "1 of them admitted without a cap" in row


def test_the_overview_folds_idle_drains_and_free_accounts(admin_client: Client) -> None:
    seeded = crowd.crowded()
    html = page(admin_client, reverse("ops:overview"))
    drains = section(html, "drains")
    assert drains.count('class="empty-drains"') == 1
    assert "12 drains did nothing from " in drains
    # The drain the cap held and the one that admitted, each a row of its own.
    assert drains.count('<td class="when">') == 2
    accounts = section(html, "accounts")
    assert accounts.count('<td class="account">') == len(seeded.cooling)
    assert "12 free:" in accounts


@pytest.mark.slow
def test_a_patch_shows_its_control_characters_as_pictures(
    admin_client: Client, tmp_path: Path, settings: Any
) -> None:
    project = git_project(tmp_path / "repo")
    settings.LOOPSWEB_PROJECT_ROOTS = [str(tmp_path)]
    admitted = route(event=generic_event(project=str(project)))
    run = WorkflowRun.objects.get(pk=admitted.run.id)
    base = git(project, "rev-parse", "HEAD").strip()
    branch = f"loopsweb/run-{run.id}"
    git(project, "checkout", "-q", "-b", branch)
    (project / "notes.txt").write_text(
        "title \x1b]0;owned\x07 and \x1b[31mred\x1b[0m\n"
    )
    git(project, "add", "notes.txt")
    git(project, "commit", "-q", "-m", "notes")
    head = git(project, "rev-parse", "HEAD").strip()
    git(project, "checkout", "-q", "main")
    WorkflowRun.objects.filter(pk=run.pk).update(
        status=RunStatus.SUCCEEDED,
        finished_at=timezone.now() - timedelta(minutes=1),
        worktree_branch=branch,
        commit_head=head,
        delivery_json={"baseCommit": base},
    )
    html = page(admin_client, reverse("ops:work-item", args=[run.work_item_id]))
    patch = html.split('<pre class="patch">')[1].split("</pre>")[0]
    assert "+title ␛]0;owned␇ and ␛[31mred␛[0m" in patch
    assert "\x1b" not in html and "\x07" not in html


def test_visible_controls_keeps_lines_and_tabs() -> None:
    assert visible_controls("a\tb\r\nc\rd\x00\x7f\x9b") == "a\tb\r\nc␍d␀␡\\x9b"
    assert visible_controls("plain ✓ text\n") == "plain ✓ text\n"


def test_chart_labels_grow_with_the_names_and_shorten_the_longest() -> None:
    assert label_width(["a", "b"]) == LABEL_W
    long = "codex_platform_team_subscription_for_the_nightly_builds_07"
    short = chart_label(long)
    assert len(short) == LABEL_MOST_CHARS and short.endswith("builds_07")
    assert short.startswith("codex_platform") and "…" in short
    assert label_width([long]) == LABEL_MOST_W
    assert (
        LABEL_W < label_width(["claude_platform_team_subscription_04"]) < LABEL_MOST_W
    )
