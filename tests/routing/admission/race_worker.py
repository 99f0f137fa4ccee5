"""One racing router process (run by test_admission_race): routes events and churns.

Usage: python -m tests.routing.admission.race_worker WORKER_ID ROUTES SEED
Prints one JSON line: {"created": n, "throttled": n, "violations": [...]}.

After each admission it reads the active counts without any lock: a count above its cap,
seen at any moment, proves an over-admission.
"""

from __future__ import annotations

import json
import os
import random
import sys

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loopsweb.settings")
django.setup()

from ledger.models import WorkflowRun, WorkflowStepRun, WorkflowWorkItem  # noqa: E402
from ledger.selectors import account_load, active_counts  # noqa: E402
from routing.admission import CREATED, route_event, route_options  # noqa: E402
from tests.routing.helpers import created_route  # noqa: E402

# The caps the check holds the counts to, and the routing options that set them.
LIMITS = {
    "max_active": 5,
    "max_active_per_project": 3,
    "max_active_per_project_group": 4,
    "max_per_profile": 2,
}
CAPS = {**LIMITS, "max_active_scope": "race", "auth_profile_pool": "acctA,acctB,acctC"}
PROJECTS = [("/srv/race/p1", "g"), ("/srv/race/p2", "g"), ("/srv/race/p3", None)]


def check() -> list[str]:
    found = []
    for project, group in PROJECTS:
        counts = active_counts(scope="race", project_key=project, project_group=group)
        if counts.scope > LIMITS["max_active"]:
            found.append(f"scope {counts.scope}")
        if counts.project > LIMITS["max_active_per_project"]:
            found.append(f"project {project} {counts.project}")
        if (
            group
            and (counts.project_group or 0) > LIMITS["max_active_per_project_group"]
        ):
            found.append(f"group {counts.project_group}")
    for account, load in account_load().total().items():
        if load > LIMITS["max_per_profile"]:
            found.append(f"account {account} {load}")
    return found


def finish_one(rng: random.Random, mine: list[str]) -> None:
    if not mine:
        return
    item_id = mine.pop(rng.randrange(len(mine)))
    item = WorkflowWorkItem.objects.get(pk=item_id)
    WorkflowStepRun.objects.filter(workflow_run_id=item.workflow_run_id).update(
        status="succeeded"
    )
    WorkflowRun.objects.filter(pk=item.workflow_run_id).update(status="succeeded")
    WorkflowWorkItem.objects.filter(pk=item_id).update(status="succeeded")


def main() -> None:
    worker, routes, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed * 1000 + worker)
    options = route_options(CAPS)
    tally = {"created": 0, "throttled": 0}
    violations: list[str] = []
    mine: list[str] = []
    for n in range(routes):
        project, group = rng.choice(PROJECTS)
        data = {"project_path": project, "message": "race"}
        if group:
            data["project_group"] = group
        event = {"id": f"w{worker}-{n}", "type": "race", "source": "race", "data": data}
        result = route_event(kind="generic", envelope=event, options=options, env={})
        tally[result.kind] = tally.get(result.kind, 0) + 1
        if result.kind == CREATED:
            mine.append(created_route(result).work_item.id)
            violations += check()
        if rng.random() < 0.4:
            finish_one(rng, mine)
    print(json.dumps({**tally, "violations": violations}))


if __name__ == "__main__":
    main()
