from __future__ import annotations

import pytest
from django.urls import reverse

from ledger.models import (
    Loop,
    LoopRun,
    WorkflowEvent,
    WorkflowInvocation,
    WorkflowRun,
    WorkflowSpec,
    WorkflowStepRun,
    WorkflowWorkItem,
)
from tests.factories import make_loop, make_run, make_step_run, make_work_item

pytestmark = pytest.mark.django_db

LEDGER_MODELS = [
    WorkflowInvocation,
    WorkflowWorkItem,
    WorkflowSpec,
    WorkflowRun,
    WorkflowStepRun,
    WorkflowEvent,
    Loop,
    LoopRun,
]


def _seed() -> WorkflowWorkItem:
    item = make_work_item(route_scope="drain-a", project_group="g1", status="running")
    run = make_run(work_item=item, invocation=item.invocation)
    make_step_run(
        workflow_run=run,
        step_id="worker",
        account_profile="acctA",
        account_tool="codewith",
    )
    WorkflowEvent.objects.create(workflow_run=run, sequence=1, event_type="created")
    loop = make_loop()
    LoopRun.objects.create(
        loop=loop, loop_name=loop.name, scheduled_for=loop.created_at, status="running"
    )
    return item


@pytest.mark.parametrize("model", LEDGER_MODELS, ids=lambda m: m.__name__)
def test_every_ledger_changelist_and_change_page_renders_for_staff(
    admin_client, model
) -> None:
    _seed()
    opts = model._meta
    response = admin_client.get(
        reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
    )
    assert response.status_code == 200
    obj = model.objects.first()
    response = admin_client.get(
        reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])
    )
    assert response.status_code == 200


@pytest.mark.parametrize("model", LEDGER_MODELS, ids=lambda m: m.__name__)
def test_ledger_history_cannot_be_added_or_deleted_from_the_admin(
    admin_client, model
) -> None:
    opts = model._meta
    assert (
        admin_client.get(
            reverse(f"admin:{opts.app_label}_{opts.model_name}_add")
        ).status_code
        == 403
    )


def test_work_items_filter_by_status_scope_group_and_account(admin_client) -> None:
    item = _seed()
    other = make_work_item(route_scope="drain-b", status="deferred")
    url = reverse("admin:ledger_workflowworkitem_changelist")
    for query, expected, absent in [
        ({"status": "running"}, item, other),
        ({"route_scope": "drain-b"}, other, item),
        ({"project_group": "g1"}, item, other),
        ({"account_profile": "acctA"}, item, other),
    ]:
        body = admin_client.get(url, query).content.decode()
        assert expected.id in body and absent.id not in body, query


def test_anonymous_users_are_sent_to_the_login_page(client) -> None:
    response = client.get(reverse("admin:ledger_workflowworkitem_changelist"))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
