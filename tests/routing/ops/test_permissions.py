"""Who sees what (docs/operations.md, "Who sees what"): /ops/, the API's
staff sessions, /metrics and the admin's work-item page follow Django's rule, a staff user
sees only the records their view permissions cover (ledger.webkit.access).

Every /ops/ address is read from routing/ops/urls.py, so a new page is covered here
without a line added: its arguments are filled from `_arguments` by name (a new argument
name fails the test until it is given a value)."""

from __future__ import annotations

import io
import itertools
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.urls.resolvers import RoutePattern
from django.utils import timezone
from django_q.models import Schedule

from ledger.models import (
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowWorkItem,
    WorkItemStatus,
)
from ledger.webkit import access
from routing.models import DrainRecord, InboxEvent
from routing.ops import item as ops_item
from routing.ops import run_work
from routing.ops import urls as ops_urls
from routing.ops.views import PERMISSIONS
from runs.delivery_view import Patch
from tests.factories import make_run, make_staff_user, make_step_run, make_work_item
from tests.routing.ops import seed as ops_seed

pytestmark = pytest.mark.django_db

# What no one without the permissions may read: a step's output and error, a run's patch.
OUTPUT = "output-mark-5e1c"
ERROR = "error-mark-5e1c"
PATCH = "patch-mark-5e1c"
MARKS = (OUTPUT, ERROR, PATCH)
# The action each action address is called with.
ACTIONS = {"item-action": "retry", "run-action": "discard", "schedule-action": "pause"}
EVERY_VIEW = tuple(access.RECORDS.values())


@dataclass
class Records:
    item: WorkflowWorkItem
    run: WorkflowRun
    drain: DrainRecord
    inbox: InboxEvent
    schedule: Schedule


@pytest.fixture
def records(monkeypatch: pytest.MonkeyPatch) -> Records:
    """A failed item whose run left a patch and whose step printed and failed, a running
    step printing (the overview's live output), a drain over an inbox event, a schedule."""
    now = timezone.now()
    item = make_work_item(status=WorkItemStatus.FAILED)
    run = make_run(
        work_item=item,
        invocation=item.invocation,
        status=RunStatus.FAILED,
        worktree_branch="loopsweb/run-perm",
        commit_head="0" * 40,
        finished_at=now,
    )
    make_step_run(
        workflow_run=run,
        step_id="worker",
        status=StepStatus.FAILED,
        account_profile="acct-perm",
        started_at=now - timedelta(minutes=2),
        finished_at=now,
        stdout=OUTPUT,
        stderr=OUTPUT,
        error=ERROR,
    )
    live = make_work_item(status=WorkItemStatus.RUNNING)
    make_step_run(
        workflow_run=make_run(work_item=live, invocation=live.invocation),
        step_id="worker",
        status=StepStatus.RUNNING,
        account_profile="acct-perm",
        started_at=now - timedelta(minutes=1),
        stdout=OUTPUT,
    )
    # The patch reader needs a git branch; the rule under test is who may read it.
    for module in (ops_item, run_work):
        monkeypatch.setattr(
            module, "run_patch", lambda run, limit=None: Patch(PATCH, False)
        )
    ops_seed.drains(1, inbox_events=2)
    call_command(
        "schedule_drain", "h", "generic", "--every", "5m", stdout=io.StringIO()
    )
    return Records(
        item=item,
        run=run,
        drain=DrainRecord.objects.latest("started_at"),
        inbox=InboxEvent.objects.order_by("id").first(),
        schedule=Schedule.objects.get(name="h"),
    )


def _arguments(records: Records, name: str) -> dict[str, Any]:
    values: dict[str, Any] = {
        "item_id": records.item.id,
        "run_id": records.run.id,
        "name": "acct-perm",
        "drain_id": records.drain.id,
        "inbox_id": records.inbox.id,
        "schedule_id": records.schedule.pk,
    }
    pattern = next(p for p in ops_urls.urlpatterns if p.name == name)
    assert isinstance(pattern.pattern, RoutePattern)
    names = pattern.pattern.converters
    return {key: ACTIONS[name] if key == "action" else values[key] for key in names}


def every_ops_url(records: Records) -> list[str]:
    urls = [
        reverse(f"ops:{p.name}", kwargs=_arguments(records, str(p.name)))
        for p in ops_urls.urlpatterns
    ]
    assert len(urls) == len(ops_urls.urlpatterns) >= 15
    return urls


_names = itertools.count()


def login(*perms: str, is_staff: bool = True) -> Client:
    """A client signed in as a new staff user (is_staff=False: not staff) holding perms."""
    client = Client()
    user = make_staff_user(f"user-{next(_names)}", *perms, is_staff=is_staff)
    client.force_login(user)
    return client


def text(response: Any) -> str:
    return response.content.decode(errors="replace")


def unchanged(records: Records) -> None:
    records.item.refresh_from_db()
    records.run.refresh_from_db()
    records.schedule.refresh_from_db()
    assert records.item.status == WorkItemStatus.FAILED
    assert records.run.work_discarded_at is None
    assert records.schedule.repeats == -1
    assert LogEntry.objects.count() == 0


# --- the base permission: every /ops/ address -----------------------------------------------


def test_every_ops_address_is_guarded_by_ops_view() -> None:
    """A page added without `staff_required` / `ops_view` fails here, by its name."""
    unguarded = [p.name for p in ops_urls.urlpatterns if p.callback not in PERMISSIONS]
    assert unguarded == []
    assert all(access.ITEMS in PERMISSIONS[p.callback] for p in ops_urls.urlpatterns)


def test_the_superuser_sees_outputs_and_patches(records: Records, admin_client) -> None:
    """The control: the marks are on the pages, so their absence below means something."""
    item_page = text(admin_client.get(reverse("ops:work-item", args=[records.item.id])))
    assert ERROR in item_page and PATCH in item_page
    assert OUTPUT in text(admin_client.get(reverse("ops:overview")))
    assert PATCH in text(
        admin_client.get(reverse("ops:run-patch", args=[records.run.id]))
    )


@pytest.mark.parametrize(
    "perms",
    [(), tuple(p for p in EVERY_VIEW if p != access.ITEMS)],
    ids=["no-permission", "every-view-but-work-items"],
)
def test_staff_without_the_work_items_view_get_403_everywhere(
    records: Records, perms: tuple[str, ...]
) -> None:
    client = login(*perms)
    for url in every_ops_url(records):
        for method in (client.get, client.post):
            response = method(url)
            assert response.status_code == 403, (method, url)
            assert not any(mark in text(response) for mark in MARKS), url
    unchanged(records)


def test_not_staff_is_403_with_every_permission(records: Records) -> None:
    client = login(*EVERY_VIEW, is_staff=False)
    for url in every_ops_url(records):
        assert client.get(url).status_code == 403, url
        assert client.post(url).status_code == 403, url
    unchanged(records)


def test_the_work_items_view_opens_the_item_pages_without_outputs(
    records: Records,
) -> None:
    client = login(access.ITEMS)
    item_url = reverse("ops:work-item", args=[records.item.id])
    for url in (reverse("ops:overview"), reverse("ops:deferrals"), item_url):
        response = client.get(url)
        assert response.status_code == 200, url
        assert not any(mark in text(response) for mark in MARKS), url
    page = text(client.get(item_url))
    assert 'id="runs"' not in page and "acct-perm" not in page
    overview = text(client.get(reverse("ops:overview")))
    for section in ("running", "waiting", "accounts", "cooldowns", "drains"):
        assert f'id="{section}"' not in overview, section
    assert 'id="capacity"' in overview and 'id="scopes"' in overview
    # Every page needing another record's permission stays closed.
    names = {"overview", "deferrals", "work-item", "work-item-moved", "item-action"}
    for pattern in ops_urls.urlpatterns:
        if pattern.name in names:
            continue
        url = reverse(
            f"ops:{pattern.name}", kwargs=_arguments(records, str(pattern.name))
        )
        assert client.get(url).status_code == 403, url
        assert client.post(url).status_code == 403, url
    unchanged(records)


# --- each page's own records ----------------------------------------------------------------

PAGES = [
    ("accounts", (access.ACCOUNTS,)),
    ("hosts", (access.HOSTS,)),
    ("drains", (access.DRAINS, access.SCHEDULES)),
    ("drain", (access.DRAINS,)),
    ("run-patch", (access.RUNS,)),
]


@pytest.mark.parametrize(("name", "perms"), PAGES, ids=[n for n, _ in PAGES])
def test_a_page_opens_with_its_records_view_and_not_without_one(
    records: Records, name: str, perms: tuple[str, ...]
) -> None:
    url = reverse(f"ops:{name}", kwargs=_arguments(records, name))
    assert login(access.ITEMS, *perms).get(url).status_code == 200
    for missing in perms:
        kept = [p for p in perms if p != missing]
        assert login(access.ITEMS, *kept).get(url).status_code == 403, missing


def test_a_change_permission_counts_as_the_view_one(records: Records) -> None:
    client = login("ledger.change_workflowworkitem", "ledger.change_account")
    assert client.get(reverse("ops:accounts")).status_code == 200
    assert client.get(reverse("ops:hosts")).status_code == 403


def test_the_inbox_events_last_drain_needs_the_drains_view(records: Records) -> None:
    url = reverse("ops:inbox-last-drain", args=[records.inbox.id])
    assert login(access.ITEMS, access.DRAINS).get(url).status_code == 302


def test_actions_need_their_records_view_and_change_permissions(
    records: Records,
) -> None:
    pause = reverse("ops:schedule-action", args=[records.schedule.pk, "pause"])
    assert (
        login(access.ITEMS, "django_q.change_schedule").post(pause).status_code == 302
    )
    records.schedule.refresh_from_db()
    assert records.schedule.repeats == 0
    discard = reverse("ops:run-action", args=[records.run.id, "discard"])
    operator = login(access.ITEMS, "ledger.change_workflowworkitem")
    assert operator.post(discard).status_code == 403  # not without the runs' view
    assert (
        login(access.ITEMS, access.RUNS).post(discard).status_code == 403
    )  # nor without the change permission


# --- sections and the nav -------------------------------------------------------------------


def test_sections_show_with_their_records_view(records: Records) -> None:
    client = login(access.ITEMS, access.STEPS, access.ACCOUNTS, access.DRAINS)
    overview = text(client.get(reverse("ops:overview")))
    assert OUTPUT in overview
    for section in ("running", "waiting", "accounts", "cooldowns", "drains"):
        assert f'id="{section}"' in overview, section
    # Runs and steps together: the page shows patches and output only with both.
    item_url = reverse("ops:work-item", args=[records.item.id])
    assert PATCH not in text(client.get(item_url))
    page = text(login(access.ITEMS, access.RUNS, access.STEPS).get(item_url))
    assert ERROR in page and PATCH in page and 'id="runs"' in page


def nav(client: Client) -> str:
    page = text(client.get(reverse("ops:overview")))
    return page.split('<ul class="ops-tabs">', 1)[1].split("</ul>", 1)[0]


def test_the_nav_links_only_pages_the_user_may_open(records: Records) -> None:
    tabs = ("/ops/accounts/", "/ops/hosts/", "/ops/drains/")
    shown = nav(login(access.ITEMS))
    assert 'href="/ops/"' in shown
    assert not any(f'href="{tab}"' in shown for tab in tabs)
    shown = nav(login(*EVERY_VIEW))
    assert all(f'href="{tab}"' in shown for tab in tabs)
    shown = nav(login(access.ITEMS, access.ACCOUNTS, access.DRAINS))
    assert 'href="/ops/accounts/"' in shown
    assert 'href="/ops/hosts/"' not in shown and 'href="/ops/drains/"' not in shown


# --- the admin's work-item page, the API's staff sessions, /metrics -------------------------


def test_the_admin_item_page_shows_step_output_only_with_runs_and_steps(
    records: Records,
) -> None:
    url = reverse("admin:ledger_workflowworkitem_change", args=[records.item.id])
    response = login(access.ITEMS).get(url)
    assert response.status_code == 200
    assert 'id="item-runs"' not in text(response)
    assert not any(mark in text(response) for mark in MARKS)
    page = text(login(access.ITEMS, access.RUNS, access.STEPS).get(url))
    assert 'id="item-runs"' in page and OUTPUT in page and ERROR in page


def test_staff_sessions_on_the_api_and_metrics_need_the_view_permissions(
    records: Records,
) -> None:
    detail = f"/api/v1/work-items/{records.item.id}"
    needs = {
        "/api/v1/work-items": (),
        detail: (access.RUNS, access.STEPS),
        "/api/v1/accounts": (access.ACCOUNTS,),
        "/api/v1/drains": (access.DRAINS,),
        f"/api/v1/drains/{records.drain.id}": (access.DRAINS,),
        "/metrics": (access.ACCOUNTS, access.DRAINS),
    }
    nobody = login()
    items_only = login(access.ITEMS)
    for url, perms in needs.items():
        refused = nobody.get(url)
        assert refused.status_code == 403, url
        assert not any(mark in text(refused) for mark in MARKS), url
        assert items_only.get(url).status_code == (403 if perms else 200), url
        assert login(access.ITEMS, *perms).get(url).status_code == 200, url
    assert ERROR in text(login(*EVERY_VIEW).get(detail))
