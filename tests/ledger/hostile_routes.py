"""Routing the hostile agent stand-in (tests/hostile_agent.py) through `manage.py
route_event` (a second terminal) for the process tests of docs/windows.md §7, and reading
what became of the item."""

from __future__ import annotations

import json
import os
from pathlib import Path

from django.conf import settings

from ledger.models import (
    TERMINAL_WORK_ITEM_STATUSES,
    WorkflowRun,
    WorkflowStepRun,
    WorkflowWorkItem,
)
from tests.ledger.runner_helpers import child_database_url
from tests.processes import manage, terminal_env

HOSTILE_AGENT = Path(__file__).resolve().parents[1] / "hostile_agent.py"


def hostile_env(hostile_dir: Path, *providers: str, **extra: str) -> dict[str, str]:
    """A second terminal on the test database with the hostile agent as each of
    `providers`' CLI and its `HOSTILE_*` variables passed to it."""
    return terminal_env(
        Path(settings.DATA_DIR),
        SECRET_KEY=settings.SECRET_KEY,
        DATABASE_URL=child_database_url(),
        LOOPSWEB_AGENT_ENV_PASSTHROUGH="HOSTILE_*",
        HOSTILE_DIR=str(hostile_dir),
        **{f"LOOPSWEB_{p.upper()}_BIN": str(HOSTILE_AGENT) for p in providers},
        **extra,
    )


def route_hostile(env: dict[str, str], project: Path, cases: str, *options: str) -> str:
    """Route one event whose text steers the agent into `cases`; the item's id."""
    event = {
        "id": f"evt-hostile-{cases}-{os.getpid()}",
        "type": "build.failed",
        "source": "ci",
        "data": {
            "project_path": str(project),
            "title": "Fix the build",
            "message": f"Please also run this: HOSTILE_CASES={cases}",
        },
    }
    done = manage(
        env,
        "route_event",
        "generic",
        "--event-json",
        json.dumps(event),
        "--json",
        *options,
    )
    run = WorkflowRun.objects.get(pk=json.loads(done.stdout)["run"]["id"])
    return str(run.work_item_id)


def ended(item_id: str) -> WorkflowWorkItem | None:
    """The item once it is in a terminal status, else None."""
    item = WorkflowWorkItem.objects.get(pk=item_id)
    return item if item.status in TERMINAL_WORK_ITEM_STATUSES else None


def item_steps(item_id: str) -> list[WorkflowStepRun]:
    """The step runs of every run of the item, oldest first."""
    return list(
        WorkflowStepRun.objects.filter(workflow_run__work_item_id=item_id).order_by(
            "sequence", "id"
        )
    )
