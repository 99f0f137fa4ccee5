"""The previous release's code on an upgraded ledger, run in a process of its own by
tests/ledger/test_upgrade.py:

    python -c "from tests.ledger.upgrade_probe import rollback_probe; rollback_probe()"

with DATABASE_URL pointing at an upgraded copy of the fixture. Nothing here imports the
project before `django.setup()` (rollback_probe calls it first).
"""

from __future__ import annotations

import json
from typing import Any

# Values the fixture uses (see the build script): alpha/web has active NULL-scope items.
ALPHA, WEB = "/srv/repos/alpha", "web"
QUEUED_ITEM = "01900500000000000000000000000001"
OLD_CODE_ITEM = "0190ff00000000000000000000000001"
NEW_CODE_ITEM = "0190ff00000000000000000000000002"


def rollback_probe() -> None:
    """Runs in a subprocess on an upgraded copy (DATABASE_URL): the previous release's code,
    i.e. the historical models at ledger 0001, then the current code. Prints JSON."""
    import django

    django.setup()
    from dataclasses import asdict

    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    from ledger.models import WorkflowWorkItem, WorkItemStatus
    from ledger.selectors import active_counts

    state = MigrationExecutor(connection).loader.project_state(
        ("ledger", "0001_initial")
    )
    old_item = state.apps.get_model("ledger", "WorkflowWorkItem")
    old_invocation = state.apps.get_model("ledger", "WorkflowInvocation")
    out: dict[str, Any] = {
        "old_columns": sorted(f.column for f in old_item._meta.concrete_fields),
        "old_read": sorted(old_item.objects.values_list("id", "status")),
    }
    # Old code writes: a new item (it knows nothing of route_scope) and an update.
    invocation = old_invocation.objects.create(
        source_kind="todos-task",
        source_id="evt-old-code",
        source_dedupe_key="todos-task:alpha:old-code",
        source_json={"id": "evt-old-code"},
        subject_kind="task",
        subject_json={"title": "written by the previous release"},
        intent="route",
    )
    old_item.objects.create(
        id=OLD_CODE_ITEM,
        route_key="todos-task",
        idempotency_key="todos-task:alpha:old-code",
        invocation=invocation,
        source_type="task.ready",
        source_ref="evt-old-code",
        subject_ref="task-old-code",
        project_key=ALPHA,
        project_group=WEB,
        status="running",
    )
    queued = old_item.objects.get(pk=QUEUED_ITEM)
    queued.status, queued.last_reason = "deferred", "deferred by the previous release"
    queued.save()
    out["old_read_back"] = sorted(
        old_item.objects.filter(pk__in=[OLD_CODE_ITEM, QUEUED_ITEM]).values_list(
            "id", "status", "last_reason"
        )
    )
    # The current code reads everything, including the row old code wrote.
    out["new_count"] = WorkflowWorkItem.objects.count()
    out["new_reads_old_row_scope"] = WorkflowWorkItem.objects.get(
        pk=OLD_CODE_ITEM
    ).route_scope
    caps = {"project_key": ALPHA, "project_group": WEB}
    out["scoped"] = asdict(active_counts(scope="todos-task", **caps))
    out["unscoped"] = asdict(active_counts(scope=None, **caps))
    WorkflowWorkItem.objects.create(
        id=NEW_CODE_ITEM,
        route_key="todos-task",
        idempotency_key="todos-task:alpha:new-code",
        invocation_id=invocation.pk,
        source_type="task.ready",
        source_ref="evt-new-code",
        subject_ref="task-new-code",
        project_key=ALPHA,
        project_group=WEB,
        route_scope="todos-task",
        status=WorkItemStatus.ADMITTED,
    )
    out["scoped_after_new"] = asdict(active_counts(scope="todos-task", **caps))
    print(json.dumps(out))
