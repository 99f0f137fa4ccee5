"""Notifications recorded (ledger.services.notifications, docs/operations.md
"Notifications"): one row per episode, nothing at all while LOOPSWEB_NOTIFY_URL is unset,
never an error for the caller; and each hook, driven through the code that meets its
episode: a run that fails for good (and one dead-lettered), a refused login, a pool whose
every account cools (and is free again), a host gone, a run cluster gone silent."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from ledger import services
from ledger.models import (
    Account,
    AccountCooldown,
    ClusterInstance,
    Host,
    Notification,
    NotificationState,
    RunStatus,
    WorkflowWorkItem,
    WorkItemStatus,
)
from ledger.services import notifications as notes
from ledger.services.common import LedgerError
from tests.ledger.runner_helpers import cool_account, route_generic, steps_of

pytestmark = pytest.mark.django_db

URL = "http://127.0.0.1:9/hooks/notify?token=secret"


@pytest.fixture
def notify_on(settings: Any) -> None:
    settings.LOOPSWEB_NOTIFY_URL = URL
    notes.hosts_told_forget()


def rows(kind: str | None = None) -> list[Notification]:
    found = Notification.objects.order_by("created_at", "id")
    return list(found.filter(kind=kind) if kind else found)


def test_with_the_setting_unset_notify_reads_and_writes_nothing(
    settings: Any, django_assert_num_queries: Any
) -> None:
    settings.LOOPSWEB_NOTIFY_URL = ""
    with django_assert_num_queries(0):
        assert notes.notify("run_failed", "item-1:1", "a run failed") is False
        assert notes.notify_pools_available() == []
        assert notes.notify_instances_silent() == []
    assert rows() == []


def test_one_row_per_episode_queued_on_the_main_cluster_once_it_commits(
    notify_on: None, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True) as queued:
        assert notes.notify("needs_human", "item-7", "item 7 needs a human", {"n": 1})
        assert not notes.notify("needs_human", "item-7", "told again", {"n": 2})
    assert len(queued) == 1
    (row,) = rows()
    assert (row.kind, row.episode, row.text, row.payload) == (
        "needs_human",
        "item-7",
        "item 7 needs a human",
        {"n": 1},
    )
    assert row.state == NotificationState.PENDING and row.attempts == 0
    assert row.next_attempt_at is not None
    # Another kind, same episode: an episode of its own.
    assert notes.notify("run_failed", "item-7", "failed")
    (task,) = OrmQ.objects.all()
    assert task.key == "loopsweb"  # the main cluster's queue, never a run worker's
    package = SignedPackage.loads(task.payload)
    assert package["func"] == notes.NOTIFY_TASK
    assert list(package["args"]) == [row.id]


def test_a_rolled_back_caller_tells_nothing(
    notify_on: None, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True) as queued:
        with pytest.raises(RuntimeError), transaction.atomic():
            notes.notify("host_gone", "h@1", "host h is gone")
            raise RuntimeError("the caller's decision failed")
    assert queued == [] and rows() == []


def test_the_text_is_bounded_and_inert() -> None:
    text = notes.message_text(
        "title \x1b[31mred\x1b[0m <!channel> @here #12\nline two" + "x" * 5000
    )
    assert len(text) == notes.TEXT_CHARS and text.endswith("\u2026")
    assert "\x1b" not in text and "\\x1b[31mred" in text
    assert "<" not in text and ">" not in text and "\u2039!channel\u203a" in text
    assert "@here" not in text and "@\u200dhere" in text
    assert "\nline two" in text


def test_a_long_pool_keeps_a_bounded_key() -> None:
    members = [f"account-{n:03}" for n in range(60)]
    key = notes.pool_key(members)
    assert len(key) == notes.POOL_KEY_CHARS
    assert key == notes.pool_key(reversed(members))
    assert key != notes.pool_key(members[:-1])
    assert notes.pool_key(["b", "a"]) == "a,b"


def test_a_database_error_is_one_line_and_the_caller_goes_on(
    notify_on: None, caplog: pytest.LogCaptureFixture
) -> None:
    Account.objects.create(name="acct-before", provider="codewith")
    with transaction.atomic():
        with connection.cursor() as cursor:  # rolled back with the test
            cursor.execute(f'DROP TABLE "{Notification._meta.db_table}"')
        with caplog.at_level(logging.WARNING, logger=notes.__name__):
            assert notes.notify("login_failed", "acct@1", "refused") is False
        # The caller's transaction is whole: it reads and writes on.
        Account.objects.create(name="acct-after", provider="codewith")
        assert Account.objects.count() == 2
    (line,) = [r for r in caplog.records if r.name == notes.__name__]
    assert "not recorded" in line.getMessage() and line.exc_info is None


# --- the hooks ---------------------------------------------------------------------------------


def test_a_run_that_fails_for_good_is_told_once(
    notify_on: None, tmp_path: Path
) -> None:
    run = route_generic(tmp_path, message="Fix the parser", created=True).run
    assert services.run_claim(run_id=run.id, worker="w") is not None
    services.run_finalize(run_id=run.id, status=RunStatus.FAILED, error="exit 3")
    with pytest.raises(LedgerError):
        services.run_finalize(run_id=run.id, status=RunStatus.FAILED, error="again")
    item = WorkflowWorkItem.objects.get(pk=run.work_item_id)
    assert not notes.notify_run_failed(
        item_id=item.id, run_id=run.id, status="failed", error="again"
    )

    (row,) = rows()
    assert item.status == WorkItemStatus.FAILED
    assert (row.kind, row.episode) == ("run_failed", f"{item.id}:{item.attempts}")
    assert "Fix the parser" in row.text and "exit 3" in row.text
    assert item.idempotency_key in row.text
    assert row.payload["workItemId"] == item.id and row.payload["runId"] == run.id


def test_a_failed_run_with_an_attempt_left_tells_nothing(
    notify_on: None, tmp_path: Path
) -> None:
    run = route_generic(tmp_path, max_attempts="2", created=True).run
    assert services.run_claim(run_id=run.id, worker="w") is not None
    services.run_finalize(run_id=run.id, status=RunStatus.FAILED, error="exit 3")
    assert WorkflowWorkItem.objects.get(pk=run.work_item_id).status == "admitted"
    assert rows() == []


def test_a_dead_lettered_item_is_told_once(
    notify_on: None, tmp_path: Path, settings: Any
) -> None:
    settings.LOOPSWEB_MAX_REDISPATCH = 0
    run = route_generic(tmp_path, max_attempts="3", created=True).run
    assert services.run_claim(run_id=run.id, worker="w") is not None
    services.run_finalize(run_id=run.id, status=RunStatus.FAILED, error="exit 3")
    item = WorkflowWorkItem.objects.get(pk=run.work_item_id)
    assert item.status == WorkItemStatus.DEAD_LETTER
    (row,) = rows()
    assert (row.kind, row.episode) == ("run_failed", f"{item.id}:{item.attempts}")
    assert "dead_letter" in row.text and "dead-lettered" in row.text


def test_a_refused_login_is_one_episode_until_its_mark_is_cleared(
    notify_on: None,
) -> None:
    Account.objects.create(name="acctA", provider="codewith")
    first = timezone.now() - timedelta(minutes=5)
    for minutes in (5, 4, 3):  # three steps meet the same broken login
        assert services.account_login_failed_record(
            profile="acctA",
            reason="Not logged in",
            now=timezone.now() - timedelta(minutes=minutes),
        )
    (row,) = rows()
    assert row.kind == "login_failed" and row.episode.startswith("acctA@")
    assert row.episode == f"acctA@{row.payload['since']}"
    assert abs(datetime.fromisoformat(row.payload["since"]) - first) < timedelta(
        seconds=5
    )
    assert "Not logged in" in row.text

    assert services.account_login_clear(name="acctA")
    services.account_login_failed_record(profile="acctA", reason="401 again")
    assert [r.kind for r in rows()] == ["login_failed", "login_failed"]
    # No account of that name: nothing is marked, nothing is told.
    assert not services.account_login_failed_record(profile="ghost", reason="401")
    assert len(rows()) == 2


def test_a_pool_whose_every_account_cools_is_one_exhausted_available_pair(
    notify_on: None, tmp_path: Path
) -> None:
    run = route_generic(tmp_path, auth_profile_pool="acctA,acctB", created=True).run
    assert services.run_claim(run_id=run.id, worker="w") is not None
    cool_account("acctA")
    cool_account("acctB")
    step = steps_of(run)["worker"]
    for _ in range(3):  # the step polls while it waits: one episode
        waits = services.step_start(step_run_id=step.id, worker="w")
        assert waits.wait_code == "pool_rate_limited"
    (exhausted,) = rows()
    assert exhausted.kind == "pool_exhausted"
    assert exhausted.episode.startswith("acctA,acctB@")
    assert exhausted.payload["members"] == ["acctA", "acctB"]
    assert "acctA, acctB" in exhausted.text and step.step_id in exhausted.text

    assert notes.notify_pools_available() == []  # still cooling: nothing
    AccountCooldown.objects.filter(pk="acctB").delete()
    assert notes.notify_pools_available() == [exhausted.episode]
    assert notes.notify_pools_available() == []
    available = rows("pool_available")
    assert [r.episode for r in available] == [exhausted.episode]
    assert "acctB" in available[0].text

    # Cooling again later is a new episode.
    cool_account("acctB")
    later = timezone.now() + timedelta(seconds=1)
    services.step_start(step_run_id=step.id, worker="w", now=later)
    assert len(rows("pool_exhausted")) == 2


def test_new_work_a_cooling_pool_defers_is_the_same_episode(
    notify_on: None, tmp_path: Path
) -> None:
    cool_account("acctA")
    cool_account("acctB")
    for _ in range(3):
        held = route_generic(tmp_path, auth_profile_pool="acctA,acctB")
        assert held.reason_code == "cooldown"
    (row,) = rows()
    assert row.kind == "pool_exhausted" and row.episode.startswith("acctA,acctB@")
    assert "new work" in row.text
    AccountCooldown.objects.filter(pk="acctA").delete()
    assert notes.notify_pools_available() == [row.episode]


def test_a_host_gone_is_told_once_per_silence(notify_on: None) -> None:
    seen = timezone.now() - timedelta(hours=1)
    Host.objects.create(name="host-gone", queue="loopsweb-runs@host-gone", seen_at=seen)
    Host.objects.create(
        name="host-live", queue="loopsweb-runs@host-live", seen_at=timezone.now()
    )
    for _ in range(3):  # every heartbeat of a live host meets it
        services.runs_end_on_gone_hosts()
    notes.hosts_told_forget()  # another process: its write finds the row
    services.runs_end_on_gone_hosts()
    (row,) = rows()
    assert (row.kind, row.episode) == ("host_gone", f"host-gone@{seen.isoformat()}")
    assert "host-gone" in row.text

    # It came back, then went silent again: a new episode.
    again = timezone.now() - timedelta(minutes=30)
    Host.objects.filter(name="host-gone").update(seen_at=again)
    services.runs_end_on_gone_hosts()
    assert len(rows("host_gone")) == 2


def test_a_silent_run_cluster_is_told_once(notify_on: None) -> None:
    now = timezone.now()

    def instance(name: str, seen: timedelta, **fields: Any) -> None:
        ClusterInstance.objects.create(
            instance=name,
            host="host-a",
            machine_id="m",
            boot_id="b",
            pid_namespace="p",
            pid=1,
            seen_at=now - seen,
            **fields,
        )

    instance("silent", timedelta(minutes=5))
    instance("live", timedelta(seconds=5))
    instance("ended", timedelta(minutes=5), ended_at=now)
    instance("run-workflow", timedelta(minutes=5), cluster=False)
    instance("ancient", timedelta(days=3))

    assert notes.notify_instances_silent(now) == ["silent"]
    assert notes.notify_instances_silent(now) == []
    (row,) = rows()
    assert (row.kind, row.episode) == ("cluster_silent", "silent")
    assert "host-a" in row.text


@pytest.mark.django_db
def test_the_notify_url_is_a_secret_no_agent_output_keeps(settings: Any) -> None:
    """A chat webhook's URL is its credential: held like loopsweb's other secrets, so a
    step that printed it has it replaced before anything stores it."""
    from ledger.held_secrets import held_secrets, held_secrets_forget

    url = "https://hooks.slack.example/services/T000/B000/XXXXsecretXXXX"
    settings.LOOPSWEB_NOTIFY_URL = url
    held_secrets_forget()
    try:
        assert held_secrets().get("LOOPSWEB_NOTIFY_URL") == url
    finally:
        held_secrets_forget()
