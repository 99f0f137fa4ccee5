"""GET /metrics: Prometheus text computed from rows, behind a metrics token or staff (issue 8)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.models import Account, AccountCooldown, WorkflowWorkItem
from ledger.webkit import access
from routing.metrics.views import escape_label
from routing.models import DrainRecord, InboxEvent
from tests.factories import make_run, make_staff_user, make_step_run, make_work_item
from tests.routing.api.helpers import bearer, make_token

pytestmark = pytest.mark.django_db

# One sample line of the 0.0.4 text format: name, optional {labels}, a number.
SAMPLE = re.compile(
    r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>(?:[a-zA-Z_]\w*="(?:[^"\\\n]|\\[\\"n])*",?)*)\})? '
    r"(?P<value>-?[0-9.e+-]+|NaN|[+-]Inf)$"
)
LABEL = re.compile(r'([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"')


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m[1], m[1]), value)


def parse(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The samples of an exposition, checking every line's syntax and HELP/TYPE order."""
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    typed: dict[str, str] = {}
    assert text.endswith("\n")
    for line in text.rstrip("\n").split("\n"):
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("gauge", "counter", "summary") and name not in typed
            typed[name] = kind
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name = match["name"]
        family = re.sub(r"_(sum|count)$", "", name)
        assert name in typed or family in typed, f"{name} has no TYPE line"
        labels = frozenset(
            (k, _unescape(v)) for k, v in LABEL.findall(match["labels"] or "")
        )
        samples[(name, labels)] = float(match["value"])
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


@pytest.fixture
def scrape(client: Client):
    _, token = make_token("metrics")

    def get() -> dict:
        response = client.get("/metrics", **bearer(token))
        assert response.status_code == 200
        assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        return parse(response.content.decode())

    return get


def test_an_empty_ledger_exposes_zeroes_for_every_fixed_series(scrape) -> None:
    samples = scrape()
    assert value(samples, "loopsweb_oldest_deferred_age_seconds") == 0
    for state in ("pending", "deferred", "failed"):
        assert value(samples, "loopsweb_inbox_events", state=state) == 0
    for kind in ("generic-event", "todos-task"):
        assert value(samples, "loopsweb_drains_total", kind=kind) == 0
        assert (
            value(samples, "loopsweb_drain_items_total", kind=kind, result="created")
            == 0
        )
        assert value(samples, "loopsweb_drain_duration_seconds_count", kind=kind) == 0


def test_metrics_report_scopes_caps_accounts_cooldowns_deferrals_drains_and_inbox(
    scrape,
) -> None:
    now = timezone.now()
    make_work_item(status="admitted", route_scope="nightly")
    make_work_item(status="running", route_scope="nightly")
    make_work_item(status="succeeded", route_scope="nightly")
    old = make_work_item(
        status="deferred", route_scope="nightly", reason_code="route_cap"
    )
    WorkflowWorkItem.objects.filter(pk=old.pk).update(
        created_at=now - timedelta(hours=1)
    )
    make_work_item(status="deferred", reason_code="profile_cap")
    make_work_item(status="deferred", reason_code="profile_cap")

    running = make_run(status="running")
    make_step_run(workflow_run=running, status="running", account_profile="acct-a")
    queued = make_run(status="queued")
    make_step_run(workflow_run=queued, account_profile="acct-b")
    AccountCooldown.objects.create(
        account_profile="acct-b", until=now + timedelta(seconds=600), reason="429"
    )
    AccountCooldown.objects.create(
        account_profile="acct-old", until=now - timedelta(seconds=5)
    )  # expired: no cooldown series

    DrainRecord.objects.create(
        kind="generic-event",
        route_scope="nightly",
        started_at=now - timedelta(minutes=2),
        duration_ms=1500,
        created=2,
        throttled=1,
        options_json={
            "max_active": 5,
            "auth_profile_pool": "acct-a,acct-b",
            "max_per_profile": 3,
        },
    )
    DrainRecord.objects.create(
        kind="generic-event",
        route_scope="nightly",
        started_at=now - timedelta(minutes=1),
        duration_ms=500,
        deduped=4,
        fatal=1,
        skipped=1,
        options_json={"max_active": 2, "auth_profile_pool": "acct-a,acct-b"},
    )
    DrainRecord.objects.create(  # dry runs are previews, not drains
        kind="generic-event", started_at=now, dry_run=True, duration_ms=9000, created=9
    )
    for i, state in enumerate(["pending", "pending", "deferred", "failed", "admitted"]):
        InboxEvent.objects.create(
            source="ci", event_id=str(i), event_type="t", state=state
        )

    s = scrape()
    assert value(s, "loopsweb_active_work_items", route_scope="nightly") == 2
    # The latest real drain of the scope says max_active 2 (the older one said 5).
    assert value(s, "loopsweb_route_scope_max_active", route_scope="nightly") == 2
    assert value(s, "loopsweb_account_running_steps", account="acct-a") == 1
    assert value(s, "loopsweb_account_reserved_steps", account="acct-b") == 1
    assert (
        value(s, "loopsweb_account_max_per_profile", account="acct-a") == 2
    )  # default
    assert 590 < value(s, "loopsweb_account_cooldown_seconds", account="acct-b") <= 600
    assert (
        "loopsweb_account_cooldown_seconds",
        frozenset({("account", "acct-old")}),
    ) not in s
    assert value(s, "loopsweb_deferred_work_items", reason_code="route_cap") == 1
    assert value(s, "loopsweb_deferred_work_items", reason_code="profile_cap") == 2
    assert 3590 < value(s, "loopsweb_oldest_deferred_age_seconds") < 3700
    g = {"kind": "generic-event"}
    assert value(s, "loopsweb_drains_total", **g) == 2
    assert value(s, "loopsweb_drain_items_total", result="created", **g) == 2
    assert value(s, "loopsweb_drain_items_total", result="deduped", **g) == 4
    assert value(s, "loopsweb_drain_items_total", result="throttled", **g) == 1
    assert value(s, "loopsweb_drain_items_total", result="fatal", **g) == 1
    assert value(s, "loopsweb_drain_duration_seconds_sum", **g) == 2.0
    assert value(s, "loopsweb_drain_duration_seconds_count", **g) == 2
    assert value(s, "loopsweb_drain_last_duration_seconds", **g) == 0.5
    assert value(s, "loopsweb_inbox_events", state="pending") == 2
    assert value(s, "loopsweb_inbox_events", state="failed") == 1
    assert ("loopsweb_inbox_events", frozenset({("state", "admitted")})) not in s


def test_label_values_are_escaped(scrape) -> None:
    nasty = 'we"ird\\scope\nname'
    make_work_item(status="admitted", route_scope=nasty)
    assert escape_label(nasty) == 'we\\"ird\\\\scope\\nname'
    samples = scrape()  # parse() rejects any line a raw quote or newline would break
    assert value(samples, "loopsweb_active_work_items", route_scope=nasty) == 1


def test_staff_may_scrape_and_everyone_else_is_refused(client: Client) -> None:
    assert client.get("/metrics").status_code == 401
    _, read_token = make_token("read")
    assert client.get("/metrics", **bearer(read_token)).status_code == 403
    client.force_login(
        make_staff_user("op", access.ITEMS, access.ACCOUNTS, access.DRAINS)
    )
    response = client.get("/metrics")
    assert (
        response.status_code == 200
        and b"# TYPE loopsweb_drains_total counter" in response.content
    )


def test_a_scrape_runs_the_same_queries_for_3_and_30_of_everything(
    client: Client,
) -> None:
    _, token = make_token("metrics")
    client.get("/metrics", **bearer(token))  # first use writes last_used_at
    counts = []
    now = timezone.now()
    for n in (3, 30):
        for i in range(n - (3 if n == 30 else 0)):
            tag = f"{n}-{i}"
            make_work_item(
                status="deferred", route_scope=f"s{tag}", reason_code=f"r{tag}"
            )
            make_work_item(status="admitted", route_scope=f"s{tag}")
            run = make_run(status="running")
            make_step_run(
                workflow_run=run,
                status="running",
                account_profile=f"a{tag}",
                started_at=now,
                usage_input_tokens=10,
                usage_output_tokens=2,
            )
            Account.objects.create(name=f"a{tag}", provider="codex")
            AccountCooldown.objects.create(
                account_profile=f"c{tag}", until=now + timedelta(hours=1)
            )
            DrainRecord.objects.create(
                kind="todos-task",
                route_scope=f"s{tag}",
                started_at=now,
                options_json={"max_active": 1},
            )
            InboxEvent.objects.create(source="s", event_id=tag, event_type="t")
        with CaptureQueriesContext(connection) as captured:
            response = client.get("/metrics", **bearer(token))
        assert response.status_code == 200
        assert response.content.count(b"loopsweb_route_scope_max_active{") == n
        assert response.content.count(b"loopsweb_account_registered{") == n
        assert (
            response.content.count(b"loopsweb_account_tokens{") == n * 2 * 3
        )  # 5h and 7d, input/output/cached
        counts.append(len(captured))
    # token + twelve (routing.metrics.collect; the registry and the usage are one each),
    # and on PostgreSQL the admission lock's state (pg_locks)
    assert counts[0] == counts[1] == 13 + (connection.vendor == "postgresql")
