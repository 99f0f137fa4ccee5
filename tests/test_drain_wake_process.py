"""A task that arrives starts at once, with the processes `make run` starts: an event a second
terminal ingests (`manage.py ingest_events`) wakes the drain schedule that takes it, and its
run reaches its first step long before the schedule fires again (routing/drains/wake.py).

The schedule runs every 60 minutes and has fired once (`schedule_drain` makes it due at
once), so only a wake-up can admit the event within the test; the ledger says what ran.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.utils import timezone
from django_q.models import Schedule, Task

from ledger.models import StepStatus, WorkflowStepRun
from routing.drains.wake import WOKEN_FUNC
from routing.models import DrainRecord, InboxEvent
from tests.ledger.runner_helpers import start_installation
from tests.processes import (
    free_port,
    generic_event,
    manage,
    stop_make_run,
    wait_for_http,
    wait_until,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.xdist_group("installation"),
]


def test_an_ingested_event_wakes_its_drain_and_the_run_starts_before_the_schedule_fires(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    port = free_port()
    env, log, proc = start_installation(tmp_path, port, FAKE_AGENT_SLEEP="0")
    try:
        wait_for_http(f"http://127.0.0.1:{port}/admin/login/", timeout=90)
        manage(env, "schedule_drain", "hourly", "generic", "--every", "60m")
        # Its first firing (due at once): an empty drain; the next is an hour away.
        wait_until(
            lambda: DrainRecord.objects.filter(name="hourly").exists(),
            timeout=90,
            what="the schedule's first drain",
        )
        next_run = Schedule.objects.get(name="hourly").next_run
        assert next_run > timezone.now()

        event_file = tmp_path / "event.json"
        event_file.write_text(json.dumps(generic_event(project, 1)))
        ingested_at = timezone.now()
        manage(env, "ingest_events", str(event_file))
        step = wait_until(
            lambda: WorkflowStepRun.objects.filter(
                status__in=(StepStatus.RUNNING, StepStatus.SUCCEEDED)
            ).first(),
            timeout=90,
            what="the ingested event's first step to start",
        )
    finally:
        stop_make_run(proc)
    output = log.read_text(errors="replace")
    assert "BadSignature" not in output and "Traceback" not in output, output[-3000:]

    assert step.started_at is not None and ingested_at < step.started_at < next_run
    assert InboxEvent.objects.get().state == "admitted"
    woken = Task.objects.filter(func=WOKEN_FUNC, group="hourly")
    assert woken.exists() and all(t.success for t in woken), list(woken)
    drains = DrainRecord.objects.filter(name="hourly").order_by("started_at")
    assert [d.created for d in drains] == [0, 1]
    assert Schedule.objects.get(name="hourly").next_run == next_run  # never fired again
