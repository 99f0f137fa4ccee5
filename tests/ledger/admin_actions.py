"""Acting through the ledger admin in tests (ledger/admin/): the work-item and run lists, an
action posted as the changelist's form posts it, the messages the page then shows, and work
items admitted through routing to act on.

Used by tests/ledger/test_admin_console.py and by the console tests of tests/routing/ops/.
"""

from __future__ import annotations

from typing import Any

from django.test import Client
from django.urls import reverse

from ledger.models import WorkflowWorkItem
from tests.routing.helpers import generic_event, route

ITEMS = reverse("admin:ledger_workflowworkitem_changelist")
RUNS = reverse("admin:ledger_workflowrun_changelist")


def admitted(n: int) -> list[WorkflowWorkItem]:
    """`n` generic events routed, each on its own project: their work items, admitted."""
    items = []
    for i in range(n):
        result = route(event=generic_event(project=f"/srv/a{i}"))
        assert result.kind == "created" and result.work_item is not None
        items.append(result.work_item)
    return items


def post_action(
    client: Client, url: str, action: str, ids: list[str], **extra: str
) -> Any:
    """Post `action` on the rows `ids` of the changelist at `url` (with `extra` fields, e.g.
    `confirm="yes", reason=...`), following the redirect; the response."""
    return client.post(
        url, {"action": action, "_selected_action": ids, **extra}, follow=True
    )


def messages_of(response: Any) -> list[str]:
    """The messages (django.contrib.messages) the response's page shows."""
    return [str(m) for m in response.context["messages"]]
