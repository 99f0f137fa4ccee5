"""Retry from the /ops/ item page in a real browser (issue 39): the failed item runs again
with the provider and pool it was admitted with, as the ledger shows.

Uses the Chromium fixture and page helpers of tests/routing/ops/browser.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model

from ledger import services
from ledger.models import WorkflowRun, WorkflowWorkItem
from tests.routing.helpers import generic_event, route
from tests.routing.ops.browser import (
    PASSWORD,
    follow,
    screenshot,
    sign_in,
    text_of,
    visit,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.sqlite,  # as tests/routing/ops/test_browser.py says why
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group(
        "browser"
    ),  # the worker's one Chromium (tests/routing/ops/browser.py)
]


def steps_of(run_id: str | None) -> set[tuple[str | None, str | None]]:
    run = WorkflowRun.objects.get(pk=run_id)
    return set(run.step_runs.values_list("account_tool", "account_profile"))


def test_retry_from_the_item_page_reruns_with_the_original_provider_and_pool(
    browser: Any,  # noqa: F811
    live_server: Any,
) -> None:
    from selenium.webdriver.common.by import By

    get_user_model().objects.create_superuser("operator", "op@example.com", PASSWORD)
    for name in ("cx-a", "cx-b"):
        services.account_add(name=name, provider="codex")
    admitted = route(
        event=generic_event(project="/srv/retry"),
        provider="codex",
        auth_profile_pool="cx-a,cx-b",
        max_per_profile=1,
        max_active_scope="night",
    )
    item = admitted.work_item
    assert item is not None and admitted.run is not None
    first = steps_of(admitted.run.id)
    assert {tool for tool, _ in first} == {"codex"}
    services.run_finalize(run_id=admitted.run.id, status="failed", error="exit 1")

    path = f"/ops/items/{item.id}/"
    sign_in(browser, live_server.url, path, f"#item-actions-{item.id}")
    assert "failed" in text_of(browser, "#item")
    screenshot(browser, "retry-1-item-failed")
    follow(
        browser,
        browser.find_element(
            By.CSS_SELECTOR, f"#item-actions-{item.id} button[name=retry]"
        ),
        "ul.messagelist li.success",
    )
    assert browser.current_url == f"{live_server.url}{path}"
    assert "admitted again" in text_of(browser, "ul.messagelist")
    assert "admitted" in text_of(browser, "#item")
    screenshot(browser, "retry-2-item-retried")

    item.refresh_from_db()
    assert (item.status, item.attempts, item.route_scope) == ("admitted", 2, "night")
    assert item.workflow_run_id != admitted.run.id
    again = steps_of(item.workflow_run_id)
    assert {tool for tool, _ in again} == {"codex"}
    assert {profile for _, profile in again} == {"cx-a", "cx-b"}
    assert WorkflowWorkItem.objects.count() == 1

    # The run page offers Cancel for the item's run in progress, and comes back to itself.
    run_path = f"/admin/ledger/workflowrun/{item.workflow_run_id}/change/"
    visit(browser, f"{live_server.url}{run_path}", f"#item-actions-{item.id}")
    follow(
        browser,
        browser.find_element(
            By.CSS_SELECTOR, f"#item-actions-{item.id} button[name=cancel]"
        ),
        "ul.messagelist li.success",
    )
    assert browser.current_url == f"{live_server.url}{run_path}"
    screenshot(browser, "retry-3-run-cancelled")
    item.refresh_from_db()
    assert item.status == "cancelled"
    assert WorkflowRun.objects.get(pk=item.workflow_run_id).status == "cancelled"
