"""Benchmark 5: operator pages and the work-item admin list over 1,000,000 work items.

Seeds 1,000,000 work items and 2,000,000 step runs (tests/bench/seed.py), 2,000 drain
records, account cooldowns and a deferred inbox, then renders, as a signed-in staff
superuser through Django's test Client (the full middleware stack, DEBUG off):
  - every page in the `ops` URL namespace, discovered with django.urls at run time (the ops
    pages are built in parallel; whatever exists is measured). A page whose URL takes an
    argument gets a real one: a deferred work item for item pages, the newest drain record
    for drain pages, an account for account pages; a page we cannot fill is listed as skipped;
  - the work-item admin changelist and one work item's admin page (a finished item with a
    run and step runs), and the inbox admin changelist.
URLs that are actions or redirects, not pages (NOT_PAGES), are listed as skipped.
Per page: the number of queries (CaptureQueriesContext, target ≤ 20) and the median render
time over RENDERS timed renders after one warm-up (reported; no target is set).
"""

from __future__ import annotations

import re
import time
from typing import Any

from tests.bench import harness

NAME = "pages"
ITEMS = harness.scaled(1_000_000)
DRAINS = harness.scaled(2_000, 50)
DEFERRED_INBOX = harness.scaled(5_000, 100)
RENDERS = 5
SLOW_PAGE_SECONDS = (
    5.0  # a page slower than this to warm up gets 3 timed renders, not 5
)
MAX_QUERIES = 20
# ops URLs that are not pages: a POST-only action, a redirect to the drain page.
NOT_PAGES = {"schedule-action", "inbox-last-drain"}


def main() -> None:
    # Under `make bench` this adopts the admission benchmark's 1M ledger (same seed, plus
    # that benchmark's few thousand finished admissions) instead of seeding it again.
    db = harness.start(NAME, adopt=True)
    try:
        run(db.vendor, adopted=db.adopted)
    finally:
        db.drop()


def run(vendor: str, *, adopted: bool = False) -> None:
    from ledger.models import WorkflowWorkItem
    from tests.bench import seed

    report = harness.Report(NAME, f"Pages over {ITEMS:,} work items", vendor)
    # History items are seed indexes 0..n-1; an adopted ledger may already hold them all.
    have = (
        WorkflowWorkItem.objects.filter(source_ref__startswith="hist-").count()
        if adopted
        else 0
    )
    stats = seed.seed_history(have, ITEMS - have) if have < ITEMS else seed.SeedStats()
    seed.seed_operations(drains=DRAINS)
    seed.seed_inbox(DEFERRED_INBOX, state="deferred", prefix="held")
    seed.after_bulk_load()
    counts = {
        table: _count(table)
        for table in ("workflow_work_items", "workflow_step_runs", "workflow_runs",
                      "workflow_work_item_deferrals", "routing_drains", "routing_inbox_events")
    }  # fmt: skip
    origin = "adopted from the admission benchmark" if adopted else "seeded here"
    print(
        f"  ledger {origin}: {counts['workflow_work_items']:,} work items, "
        f"{counts['workflow_step_runs']:,} step runs ({stats.seconds:.0f} s seeding)",
        flush=True,
    )
    report.data["seed"] = {
        "origin": origin,
        "counts": counts,
        "seconds": round(stats.seconds, 1),
    }
    report.note(
        f"ledger {origin}: "
        + ", ".join(f"{table}={n:,}" for table, n in counts.items())
    )
    client = _client()
    pages, skipped = discover_pages()
    rows, results = [], {}
    for label, url in pages:
        measured = measure(client, url)
        results[label] = {"url": url, **measured}
        if measured["status"] != 200:
            rows.append([label, url, f"HTTP {measured['status']}", "-", "-", "-", "-"])
            report.figure(f"{label}: HTTP status", measured["status"], "", "200", False)
            continue
        rows.append(
            [label, url, measured["queries"], measured["median_ms"], measured["max_ms"],
             measured["kib"], measured["slowest_query_ms"]]
        )  # fmt: skip
        report.figure(
            f"{label}: queries",
            measured["queries"],
            "",
            f"<= {MAX_QUERIES}",
            measured["queries"] <= MAX_QUERIES,
        )
        report.figure(f"{label}: median render", measured["median_ms"], "ms")
        print(
            f"  {label}: {measured['queries']} queries, {measured['median_ms']:.0f} ms",
            flush=True,
        )
    report.table(
        f"pages ({RENDERS} timed renders each, 3 if slower than {SLOW_PAGE_SECONDS:.0f} s; "
        "after one warm-up and one render with queries captured)",
        ["page", "url", "queries", "median ms", "worst ms", "KiB", "slowest query ms"],
        rows,
    )
    slow = [
        [label, r["slowest_query_ms"], r["slowest_query"]]
        for label, r in results.items()
        if r.get("slowest_query_ms", 0) >= 100
    ]
    if slow:
        report.table("queries over 100 ms (one per page)", ["page", "ms", "sql"], slow)
    for label, reason in skipped:
        report.note(f"not measured: {label} ({reason})")
    report.note(
        "renders go through django.test.Client as a staff superuser; the session and user "
        "look-ups are 2 of each page's queries"
    )
    if vendor == "sqlite":
        report.note("SQLite: no ANALYZE was run (Django never runs it)")
    report.data["pages"] = results
    report.data["skipped"] = skipped
    report.finish()


def _count(table: str) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f'SELECT COUNT(*) FROM "{table}"')
        return int(cursor.fetchone()[0])


def _client() -> Any:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user, _ = get_user_model().objects.get_or_create(
        username="bench-operator", defaults={"is_staff": True, "is_superuser": True}
    )
    # A page that raises is reported with its status (500), not allowed to stop the run.
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def _argument(url_name: str, param: str) -> str | None:
    """A real value for a URL parameter, guessed from its name and the page's name."""
    from ledger.models import WorkflowWorkItem
    from routing.models import DrainRecord
    from tests.bench.seed import ACCOUNTS

    hint = f"{param} {url_name}".lower()
    if "drain" in hint:
        return (
            DrainRecord.objects.order_by("-started_at")
            .values_list("id", flat=True)
            .first()
        )
    if "account" in hint or "profile" in hint:
        return ACCOUNTS[0]
    if any(word in hint for word in ("item", "deferr", "work")):
        # A deferred item with a deferral history (the "why did this wait" page).
        return (
            WorkflowWorkItem.objects.filter(status="deferred")
            .order_by("-id")
            .values_list("id", flat=True)
            .first()
        )
    return None


def discover_pages() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(label, url) for every ops page and the work-item changelist; and what was skipped."""
    from django.urls import NoReverseMatch, get_resolver, reverse

    pages: list[tuple[str, str]] = []
    skipped: list[tuple[str, str]] = []
    namespace = get_resolver().namespace_dict.get("ops")
    if namespace is None:
        skipped.append(("ops pages", "no 'ops' URL namespace"))
    else:
        _, resolver = namespace
        names = sorted(k for k in resolver.reverse_dict if isinstance(k, str))
        if not names:
            skipped.append(("ops pages", "the 'ops' namespace has no named URLs yet"))
        for name in names:
            if name in NOT_PAGES:
                skipped.append((f"ops:{name}", "an action or a redirect, not a page"))
                continue
            params = sorted(
                {p for possibility in resolver.reverse_dict.getlist(name) for _, ps in possibility[0] for p in ps}
            )  # fmt: skip
            kwargs = {p: _argument(name, p) for p in params}
            missing = [p for p, v in kwargs.items() if v is None]
            if missing:
                skipped.append((f"ops:{name}", f"no value for {', '.join(missing)}"))
                continue
            try:
                pages.append((f"ops:{name}", reverse(f"ops:{name}", kwargs=kwargs)))
            except NoReverseMatch as exc:
                skipped.append((f"ops:{name}", str(exc)[:120]))
    pages.append(
        ("admin work items", reverse("admin:ledger_workflowworkitem_changelist"))
    )
    item = _finished_item()
    if item is None:
        skipped.append(("admin work item page", "no finished work item with a run"))
    else:
        pages.append(
            (
                "admin work item page",
                reverse("admin:ledger_workflowworkitem_change", args=[item]),
            )
        )
    pages.append(("admin inbox events", reverse("admin:routing_inboxevent_changelist")))
    return pages, skipped


def _finished_item() -> str | None:
    """The newest succeeded work item bound to a run (its page shows runs and step runs)."""
    from ledger.models import WorkflowWorkItem

    return (
        WorkflowWorkItem.objects.filter(status="succeeded", workflow_run__isnull=False)
        .order_by("-id")
        .values_list("id", flat=True)
        .first()
    )


def measure(client: Any, url: str) -> dict[str, Any]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    started = time.perf_counter()
    response = client.get(url)  # warm-up: template compilation, first page reads
    warm_up = time.perf_counter() - started
    if response.status_code != 200:
        return {"status": response.status_code, "location": response.get("Location")}
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    captured = ctx.captured_queries
    slowest = max(
        captured, key=lambda q: float(q["time"]), default={"time": "0", "sql": ""}
    )
    times = []
    for _ in range(RENDERS if warm_up < SLOW_PAGE_SECONDS else 3):
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
    return {
        "status": response.status_code,
        "queries": len(captured),
        "median_ms": round(harness.median(times), 1),
        "max_ms": round(max(times), 1),
        "ms": [round(t, 1) for t in times],
        "kib": round(len(response.content) / 1024, 1),
        "slowest_query_ms": round(float(slowest["time"]) * 1000, 1),
        "slowest_query": re.sub(r"\s+", " ", slowest["sql"])[:400],
        "sql": [q["sql"][:300] for q in captured],
    }


if __name__ == "__main__":
    main()
