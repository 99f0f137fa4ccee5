"""A drain SIGKILLed part-way leaves the record of what it had admitted (issue 43 #7): a real
`manage.py drain` process, killed while it admits; its record is there, unfinished, naming
work items that exist; the next drain of its scope completes it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import close_old_connections

from ledger.models import WorkflowWorkItem
from routing.drains.inbox import inbox_ingest
from routing.drains.record_keeper import UNFINISHED
from routing.models import DrainRecord, InboxEvent
from tests.ledger.runner_helpers import child_database_url
from tests.processes import MANAGE_PY, manage, scratch_cwd, wait_until
from tests.routing.helpers import generic_event

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
EVENTS = 1500


def _admitted() -> int:
    close_old_connections()
    return InboxEvent.objects.filter(state="admitted").count()


def test_a_killed_drain_leaves_the_record_of_what_it_admitted(tmp_path: Path) -> None:
    inbox_ingest(
        enumerate(
            [generic_event(project=f"/srv/p{n % 40}") for n in range(EVENTS)], start=1
        )
    )
    env = {
        **os.environ,
        "DATABASE_URL": child_database_url(),
        "LOOPSWEB_DATA_DIR": str(tmp_path),
        # One candidate at a time: slow enough to be killed part-way.
        "LOOPSWEB_DRAIN_BATCH_SIZE": "1",
    }
    proc = subprocess.Popen(
        [sys.executable, MANAGE_PY, "drain", "generic", "--max-dispatch", str(EVENTS)],
        cwd=scratch_cwd(),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: _admitted() >= 20, timeout=180, what="some admissions")
        assert proc.poll() is None, "the drain finished before it could be killed"
    finally:
        proc.kill()
        proc.wait()
    admitted = _admitted()
    assert admitted < EVENTS
    [record] = DrainRecord.objects.all()
    assert record.finished_at is None and record.error == UNFINISHED
    # What it recorded it had admitted (all but its last half second at most) is real.
    assert 1 <= record.created <= admitted
    created = [r for r in record.results_json if r.get("kind") == "created"]
    assert len(created) == record.created
    items = {r["workItemId"] for r in created}
    assert WorkflowWorkItem.objects.filter(pk__in=items).count() == len(items)
    # The next drain of its scope completes the killed one's record.
    manage(env, "drain", "generic", "--max-dispatch", "1", timeout=180)
    killed = DrainRecord.objects.get(pk=record.pk)
    assert killed.finished_at is not None and killed.error == UNFINISHED
    assert killed.created == record.created
    latest = DrainRecord.objects.exclude(pk=record.pk).get()
    assert latest.finished_at is not None and latest.error is None
    assert latest.created == 1
