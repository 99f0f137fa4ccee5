"""Retry and Cancel on the /ops/ item page and the admin's run page (issue 39): POST with
CSRF, staff with the item's change permission only, audited."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from ledger.models import WorkflowEvent, WorkflowRun, WorkflowWorkItem
from ledger.services import run_finalize
from ledger.webkit import access
from tests.factories import make_staff_user
from tests.ledger.admin_actions import messages_of
from tests.routing.helpers import generic_event, route

pytestmark = pytest.mark.django_db


def failed_item() -> WorkflowWorkItem:
    item = route(event=generic_event(), auth_profile_pool="p-a,p-b").work_item
    assert item is not None and item.workflow_run_id is not None
    run_finalize(run_id=item.workflow_run_id, status="failed", error="exit 1")
    item.refresh_from_db()
    return item


def action_url(item: WorkflowWorkItem, action: str) -> str:
    return reverse("ops:item-action", args=[item.id, action])


def page(client: Client, item: WorkflowWorkItem) -> str:
    response = client.get(reverse("ops:work-item", args=[item.id]))
    assert response.status_code == 200
    return response.content.decode()


def staff(django_user_model, name: str, *, perm: bool, is_staff: bool = True) -> Client:
    # Each sees the item's page (the work items' view permission); perm: may act on it.
    user = make_staff_user(name, access.ITEMS, is_staff=is_staff)
    if perm:
        user.user_permissions.add(
            Permission.objects.get(codename="change_workflowworkitem")
        )
    client = Client()
    client.force_login(user)
    return client


def test_retry_from_the_item_page_readmits_on_the_route_and_is_audited(
    admin_client,
) -> None:
    item = failed_item()
    old_run = item.workflow_run_id
    html = page(admin_client, item)
    assert action_url(item, "retry") in html and action_url(item, "cancel") not in html

    response = admin_client.post(action_url(item, "retry"), follow=True)

    assert response.redirect_chain[-1][0] == reverse("ops:work-item", args=[item.id])
    item.refresh_from_db()
    assert (item.status, item.attempts) == ("admitted", 2)
    profiles = set(
        WorkflowRun.objects.get(pk=item.workflow_run_id).step_runs.values_list(
            "account_profile", flat=True
        )
    )
    assert profiles == {"p-a", "p-b"}
    assert messages_of(response)[0].startswith(f"Retried {item.id}: admitted again")
    entry = LogEntry.objects.get()
    assert entry.object_id == item.id and entry.user.get_username() == "admin"
    assert entry.change_message.startswith("Retry work item (ops)")
    assert WorkflowEvent.objects.filter(
        workflow_run_id=old_run, event_type="operator_retry", payload_json__user="admin"
    ).exists()
    # Admitted now: the page offers Cancel, not Retry.
    html = page(admin_client, item)
    assert action_url(item, "cancel") in html and action_url(item, "retry") not in html


def test_cancel_from_the_item_page_cancels_the_item_and_its_run(admin_client) -> None:
    item = route(event=generic_event()).work_item
    admin_client.post(action_url(item, "cancel"), {"reason": "wrong repo"})
    item.refresh_from_db()
    assert (item.status, item.last_reason) == ("cancelled", "wrong repo")
    assert WorkflowRun.objects.get(pk=item.workflow_run_id).status == "cancelled"
    assert LogEntry.objects.get().change_message == "Cancel work item (ops): wrong repo"


def test_the_run_page_shows_the_buttons_and_returns_to_itself(admin_client) -> None:
    item = failed_item()
    run_page = reverse("admin:ledger_workflowrun_change", args=[item.workflow_run_id])
    html = admin_client.get(run_page).content.decode()
    assert action_url(item, "retry") in html
    response = admin_client.post(action_url(item, "retry"), {"next": run_page})
    assert response.status_code == 302 and response["Location"] == run_page
    item.refresh_from_db()
    assert item.status == "admitted"


def test_next_must_be_this_sites(admin_client) -> None:
    item = failed_item()
    response = admin_client.post(
        action_url(item, "retry"), {"next": "https://elsewhere.example/"}
    )
    assert response["Location"] == reverse("ops:work-item", args=[item.id])


def test_a_refused_action_says_why_and_writes_nothing(admin_client) -> None:
    item = route(event=generic_event()).work_item  # admitted: not retryable
    response = admin_client.post(action_url(item, "retry"), follow=True)
    assert any(
        "retry refused" in m and "not requeueable" in m for m in messages_of(response)
    )
    assert LogEntry.objects.count() == 0
    item.refresh_from_db()
    assert (item.status, item.attempts) == ("admitted", 1)


def test_only_post_known_actions_and_items(admin_client) -> None:
    item = failed_item()
    assert admin_client.get(action_url(item, "retry")).status_code == 405
    assert admin_client.post(action_url(item, "explode")).status_code == 404
    missing = reverse("ops:item-action", args=["nope", "retry"])
    assert admin_client.post(missing).status_code == 404


@pytest.mark.parametrize(
    ("perm", "is_staff"),
    [(False, True), (True, False)],
    ids=["staff-without-change-permission", "not-staff-with-permission"],
)
def test_retry_and_cancel_need_staff_with_the_change_permission(
    django_user_model, perm: bool, is_staff: bool
) -> None:
    item = failed_item()
    client = staff(django_user_model, "someone", perm=perm, is_staff=is_staff)
    if is_staff:
        assert action_url(item, "retry") not in page(client, item)
    for action in ("retry", "cancel"):
        assert client.post(action_url(item, action)).status_code == 403
    item.refresh_from_db()
    assert (item.status, item.attempts) == ("failed", 1)
    assert LogEntry.objects.count() == 0


def test_anonymous_is_sent_to_the_login(client) -> None:
    item = failed_item()
    response = client.post(action_url(item, "retry"))
    assert response.status_code == 302 and "login" in response["Location"]
    item.refresh_from_db()
    assert item.status == "failed"


def test_staff_granted_the_permission_may_retry(django_user_model) -> None:
    item = failed_item()
    client = staff(django_user_model, "operator", perm=True)
    assert action_url(item, "retry") in page(client, item)
    client.post(action_url(item, "retry"))
    item.refresh_from_db()
    assert item.status == "admitted"


def test_a_post_without_the_csrf_token_is_refused(django_user_model) -> None:
    item = failed_item()
    user = django_user_model.objects.create_superuser("root", password="pw")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.post(action_url(item, "retry")).status_code == 403
    item.refresh_from_db()
    assert item.status == "failed"


def test_the_admin_retries_selected_items_on_their_route(admin_client) -> None:
    item = failed_item()
    items = reverse("admin:ledger_workflowworkitem_changelist")
    html = admin_client.get(
        reverse("admin:ledger_workflowworkitem_change", args=[item.id])
    ).content.decode()
    assert 'value="retry_items"' in html.split('id="item-actions"')[1]
    response = admin_client.post(
        items,
        {"action": "retry_items", "_selected_action": [item.id], "confirm": "yes"},
        follow=True,
    )
    assert messages_of(response) == ["Retried 1 workflow work item."]
    item.refresh_from_db()
    assert (item.status, item.attempts) == ("admitted", 2)
    assert LogEntry.objects.get().change_message == "Retry work items"
