"""Console details (issue 29 item 15): the cancel box's default is a placeholder, one date
format (ISO, UTC) in the admin as on /ops/, durations in s/min and each field once on the
run page, the item page at /ops/items/<id>/ (the old address redirects), and no django-axes
banner on any command's stderr."""

from __future__ import annotations

import os
import re

import pytest
from django.test import Client
from django.urls import reverse

from ledger.models import WorkflowRun, WorkflowWorkItem
from ledger.services import CANCEL_REASON_DEFAULT
from ledger.webkit.cells import seconds
from tests.ledger.runner_helpers import child_database_url
from tests.processes import manage
from tests.routing.helpers import route, todos_event

RUNS = reverse("admin:ledger_workflowrun_changelist")


def _admitted() -> WorkflowWorkItem:
    result = route("todos-task", event=todos_event(), auth_profile_pool="a-1,a-2")
    assert result.work_item is not None
    return result.work_item


@pytest.mark.django_db
def test_the_cancel_box_holds_the_default_as_a_placeholder(
    admin_client: Client,
) -> None:
    item = _admitted()
    run_id = item.workflow_run_id
    page = admin_client.post(
        RUNS, {"action": "cancel_runs", "_selected_action": [run_id]}
    ).content.decode()
    [box] = re.findall(r"<textarea[^>]*name=\"reason\"[^>]*>[^<]*</textarea>", page)
    assert f'placeholder="{CANCEL_REASON_DEFAULT}"' in box
    assert re.search(r">\s*</textarea>$", box)  # no value in the box
    assert "Leave it empty to record" in page
    admin_client.post(
        RUNS,
        {
            "action": "cancel_runs",
            "_selected_action": [run_id],
            "confirm": "yes",
            "reason": "",
        },
    )
    assert WorkflowRun.objects.get(pk=run_id).status == "cancelled"
    item.refresh_from_db()
    assert CANCEL_REASON_DEFAULT in (item.last_reason or "")


@pytest.mark.django_db
def test_a_typed_cancel_reason_is_the_reason_not_appended_to_the_default(
    admin_client: Client,
) -> None:
    item = _admitted()
    admin_client.post(
        RUNS,
        {
            "action": "cancel_runs",
            "_selected_action": [item.workflow_run_id],
            "confirm": "yes",
            "reason": "wrong project",
        },
    )
    item.refresh_from_db()
    assert "wrong project" in (item.last_reason or "")
    assert CANCEL_REASON_DEFAULT not in (item.last_reason or "")


@pytest.mark.django_db
def test_admin_dates_are_iso_utc_as_on_ops(admin_client: Client) -> None:
    item = _admitted()
    page = admin_client.get(
        reverse("admin:ledger_workflowrun_change", args=[item.workflow_run_id])
    ).content.decode()
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", page)
    assert not re.search(
        r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)\. \d", page
    )


def test_durations_read_in_seconds_and_minutes() -> None:
    assert [seconds(ms) for ms in (None, 400, 83_400, 166_800, 600_000, 7_500_000)] == [
        "",
        "0.4 s",
        "83.4 s",
        "2 min 47 s",
        "10 min",
        "2 h 5 min",
    ]


@pytest.mark.django_db
def test_the_run_page_shows_each_field_once(admin_client: Client) -> None:
    item = _admitted()
    WorkflowRun.objects.filter(pk=item.workflow_run_id).update(duration_ms=166_800)
    page = admin_client.get(
        reverse("admin:ledger_workflowrun_change", args=[item.workflow_run_id])
    ).content.decode()
    labels = re.findall(r"<label>([^<]+):</label>", page)
    assert labels and len(labels) == len(set(labels)), labels
    assert "Duration ms" not in labels and "Duration" in labels
    assert "2 min 47 s" in page


@pytest.mark.django_db
def test_the_item_page_lives_under_items_and_the_old_address_redirects(
    admin_client: Client,
) -> None:
    item = _admitted()
    url = reverse("ops:work-item", args=[item.id])
    assert url == f"/ops/items/{item.id}/"
    old = admin_client.get(f"/ops/deferrals/{item.id}/?page=1")
    assert old.status_code == 301 and old["Location"] == f"{url}?page=1"
    page = admin_client.get(url).content.decode()
    assert 'id="runs"' in page and 'id="accounts"' in page
    assert "a-1" in page and "a-2" in page
    assert "worker" in page and "verifier" in page


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "argv", [["check"], ["routes", "list"], ["drain", "--help"], ["showmigrations"]]
)
def test_no_command_prints_the_axes_banner(argv: list[str]) -> None:
    done = manage({**os.environ, "DATABASE_URL": child_database_url()}, *argv)
    assert "AXES" not in done.stderr and "AXES" not in done.stdout


@pytest.mark.django_db
def test_the_ops_item_page_opens_with_the_tasks_title_and_description(
    admin_client: Client,
) -> None:
    result = route(
        "todos-task",
        event=todos_event(
            "T-39",
            title="Make <em>login</em> fast",
            description="Line one\n<script>alert(1)</script>",
        ),
        auth_profile_pool="a-1,a-2",
    )
    assert result.work_item is not None
    html = admin_client.get(
        reverse("ops:work-item", args=[result.work_item.id])
    ).content.decode()
    title = html.split('id="task-title"')[1].split("</tr>")[0]
    assert "Make &lt;em&gt;login&lt;/em&gt; fast" in title
    description = html.split('id="task-description"')[1].split("</tr>")[0]
    assert "Line one<br>&lt;script&gt;alert(1)&lt;/script&gt;" in description
    assert "<script>alert" not in html
    # nothing reported yet: no tokens, said so
    assert "—" in html.split('id="item-usage"')[1].split("</tr>")[0]
