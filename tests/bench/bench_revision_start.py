"""Benchmark: from a "changes requested" review webhook to the revision's agent starting.

Everything runs for real on one host: the main cluster (`manage.py qcluster`, 2 workers: the
due sweep `routing.tasks.revisions_due` and the schedules), the run cluster (8 workers,
bench_run_latency's), the web server (`manage.py runserver --noreload`, as scripts/run.sh
serves), the fake agent exiting at once (sandbox off: it writes its record outside its run),
and the GitHub stand-in (tests/forge_standin.py) as a thread of this process, its pull
requests' heads read from the project's bare `origin` (`remote_git_dir`), so they follow
what loopsweb pushes. The children get LOOPSWEB_GITHUB_API_URL (the stand-in),
LOOPSWEB_GITHUB_TOKEN_FILE and LOOPSWEB_GITHUB_WEBHOOK_SECRET_FILE (0600 files) and
**LOOPSWEB_REVISION_DEBOUNCE_SECONDS=0**: a review's revision is due at once (the default
60 s debounce would be most of the figure, and is not what is measured).

Setup (the first rounds): ITEMS generic events, routed with `--deliver pull-request
--github-repo acme/widgets` on one git project (each run has its own branch) and admitted in
this process (`route_event`, the API's `route=now`) PACE s apart; the run cluster runs each
to a delivered pull request (the worker appends a line to work.txt, the verifier writes no
verdict: approve). Their admission → first agent process is the floor, measured in the same
run: the same run cluster, the same worktree and delivery start, one broker pick-up.

Then, per item, PACE s apart (free capacity: at most one revision in flight): the review is
added to the stand-in (so a `github-sync` pass would count the same review once) and its
signed `pull_request_review` webhook (state `changes_requested`) is POSTed over HTTP (urllib)
to `/hooks/github/`. The figure: from the moment the POST returned (the request recorded
and committed; the due task queued on commit) to the first agent process of the revision's
run (the record's name carries the agent's clock). Its phases, from the ledger and the
django-q task rows: the due task that admitted the round, queued while the POST was answered
(django-q2's `started` is the moment a task is queued) or not (the minute schedule's sweep
admitted it: the on-commit queueing was lost); from its queueing to the run's admission (the
main cluster's pick-up, the forge read of the pull request, the admission); from the
admission to the agent's start (the run cluster's pick-up and the worktree).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.bench import harness
from tests.bench.bench_run_latency import start_run_cluster

NAME = "revision_start"
ITEMS = harness.scaled(20, 4)
PACE = 1.5  # s between two admissions, and between two webhooks
REPO = "acme/widgets"
SECRET = "bench-webhook-secret-0123456789"
TOKEN = "ghp_bench_standin_token_0123456789"
REVIEW = "Please rename x and add a test for it."
# The clocks' slack (s) when a due task's queueing is placed within its POST.
SLACK = 0.1


def _git(directory: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(directory), "-c", "user.name=bench"]
        + ["-c", "user.email=bench@localhost", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _project(root: Path, work: Path) -> tuple[Path, Path]:
    """A git project in the benchmark's project root, its `origin` a bare repository."""
    origin, project = work / "origin.git", root / "widgets"
    _git(work, "init", "-q", "--bare", "-b", "main", str(origin))
    project.mkdir()
    _git(project, "init", "-q", "-b", "main")
    (project / "README").write_text("widgets\n")
    _git(project, "add", "README")
    _git(project, "commit", "-q", "-m", "initial")
    _git(project, "remote", "add", "origin", str(origin))
    _git(project, "push", "-q", "origin", "main")
    return project, origin


def _private_file(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


def _children_env(work: Path, forge_url: str) -> None:
    """What the clusters and the web server read (they inherit this process's environment:
    harness.child_env); this process's own settings are loaded already."""
    agent_config = work / "fake-agent.json"
    agent_config.write_text(json.dumps({"steps": {"worker": {"append": "work.txt"}}}))
    os.environ.update(
        LOOPSWEB_GITHUB_API_URL=forge_url,
        LOOPSWEB_GITHUB_TOKEN_FILE=_private_file(
            work / "github.env", f"GITHUB_TOKEN={TOKEN}\n"
        ),
        LOOPSWEB_GITHUB_WEBHOOK_SECRET_FILE=_private_file(
            work / "webhook.env", f"GITHUB_WEBHOOK_SECRET={SECRET}\n"
        ),
        LOOPSWEB_REVISION_DEBOUNCE_SECONDS="0",
        FAKE_AGENT_CONFIG=str(agent_config),
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start_web(port: int, log: Path) -> subprocess.Popen[bytes]:
    """`manage.py runserver --noreload` (what scripts/run.sh serves with), in its session."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, str(harness.ROOT / "manage.py"), "runserver"]
            + ["--noreload", f"127.0.0.1:{port}"],
            cwd=harness.child_cwd(),
            env=harness.child_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
    except urllib.error.HTTPError:
        return True  # 405: a GET of the webhook, served
    except OSError:
        return False
    return True


def _first_rounds(project: Path) -> dict[str, float]:
    """Admit ITEMS events PACE s apart: run id -> the moment its admission committed."""
    from routing.admission import CREATED, route_event, route_options

    options = route_options(
        {"max_active": 100_000, "deliver": "pull-request", "github_repo": REPO}
    )
    admitted: dict[str, float] = {}
    for n in range(ITEMS):
        result = route_event(
            kind="generic",
            envelope={
                "id": f"evt-revision-{n}-{time.time_ns()}",
                "type": "build.failed",
                "source": "bench",
                "data": {"project_path": str(project), "title": f"Fix widget {n}"},
            },
            options=options,
            env={},
        )
        if result.kind != CREATED or result.run is None:
            raise SystemExit(f"event {n} was not admitted: {result.kind}")
        admitted[str(result.run.id)] = time.time()
        time.sleep(PACE)
    return admitted


def _ended(run_ids: list[str]) -> list[Any]:
    """The runs once every one ended and recorded its delivery, else []."""
    from ledger.models import RunStatus, WorkflowRun

    runs = list(WorkflowRun.objects.filter(id__in=run_ids))
    done = [
        r
        for r in runs
        if r.status not in (RunStatus.QUEUED, RunStatus.RUNNING)
        and (r.delivery_json or {}).get("state") not in (None, "pending")
    ]
    return runs if len(done) == len(run_ids) else []


def _pull_requests(run_ids: list[str]) -> dict[str, int]:
    """Item id -> its pull request's number, once every first round delivered one."""
    runs = harness.wait_for(
        lambda: _ended(run_ids), timeout=600, what="the first rounds' deliveries"
    )
    undelivered = [
        f"{r.id} {r.status} {(r.delivery_json or {}).get('state')}: "
        f"{(r.delivery_json or {}).get('error') or (r.delivery_json or {}).get('reason')}"
        for r in runs
        if (r.delivery_json or {}).get("state") != "delivered"
    ]
    if undelivered:
        raise SystemExit("first rounds not delivered:\n" + "\n".join(undelivered))
    return {str(r.work_item_id): int(r.delivery_json["pr"]["number"]) for r in runs}


def _post_review(url: str, forge: Any, number: int) -> tuple[float, float]:
    """The review on pull request `number`, as GitHub sends it: (the moment the POST was
    sent, the moment it returned)."""
    from tests.forge_payloads import review_payload
    from tests.forge_standin import sign

    review = forge.add_review(number, "CHANGES_REQUESTED", REVIEW, login="alice")
    payload = review_payload(
        forge.pull(number),
        "changes_requested",
        REVIEW,
        login="alice",
        review_id=review["id"],
    )
    body = json.dumps(payload, separators=(",", ":")).encode()
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": "GitHub-Hookshot/bench",
            "X-GitHub-Event": "pull_request_review",
            "X-GitHub-Delivery": f"bench-{number}-{time.time_ns()}",
            "X-Hub-Signature-256": sign(SECRET, body),
        },
    )
    sent = time.time()
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise SystemExit(f"pull request #{number}: the webhook answered {exc.code} "
                         f"{exc.read()[:500]!r}") from exc  # fmt: skip
    returned = time.time()
    if "revision" not in str(answer.get("outcome", "")):
        raise SystemExit(f"pull request #{number}: the webhook answered {answer}")
    return sent, returned


def _revision_runs(items: list[str]) -> dict[str, str]:
    """Item id -> the run of its revision, once every revision started and its run ended."""
    from ledger.models import RevisionState, RunStatus, WorkflowRun, WorkItemRevision

    def bound() -> dict[str, str] | None:
        rows = list(WorkItemRevision.objects.filter(work_item_id__in=items))
        skipped = [
            f"{r.work_item_id}: {r.reason}"
            for r in rows
            if r.state == RevisionState.SKIPPED
        ]
        if skipped:
            raise SystemExit("revisions skipped:\n" + "\n".join(skipped))
        runs = {str(r.work_item_id): str(r.run_id) for r in rows if r.run_id}
        busy = WorkflowRun.objects.filter(
            id__in=list(runs.values()), status__in=[RunStatus.QUEUED, RunStatus.RUNNING]
        ).exists()
        return runs if len(runs) == len(items) and not busy else None

    found: dict[str, str] = harness.wait_for(
        bound, timeout=600, what="every revision's run to end"
    )
    return found


def _agent_starts(records: Path) -> dict[str, float]:
    """Run id -> the start of its first agent process (the record's name: its clock)."""
    first: dict[str, float] = {}
    for path in records.glob("*.json"):
        run_id = json.loads(path.read_text())["env"].get("LOOPSWEB_RUN_ID")
        started = int(path.name.split("-", 1)[0]) / 1e9
        if run_id:
            first[run_id] = min(first.get(run_id, started), started)
    return first


def _due_tasks_queued(run_ids: set[str]) -> dict[str, float]:
    """Run id -> when the `revisions_due` task whose outcome admitted it was queued
    (django-q2's `started`: set by `async_task`)."""
    from django_q.models import Task

    starts: dict[str, float] = {}
    for started, result in Task.objects.filter(
        func="routing.tasks.revisions_due"
    ).values_list("started", "result"):
        for line in (result or {}).get("revisions") or []:
            run_id = str(line).rsplit("run ", 1)[-1].strip()
            if run_id in run_ids:
                starts[run_id] = started.timestamp()
    return starts


def _phases(
    posts: dict[str, tuple[float, float]],
    revisions: dict[str, str],
    agents: dict[str, float],
) -> dict[str, list[float]]:
    """The revision path in ms: whole, its phases (module docstring), the POSTs' round
    trips, and (`late`) the rounds a due task queued outside their POST admitted."""
    from ledger.models import WorkflowRun

    admitted = {
        str(run_id): created.timestamp()
        for run_id, created in WorkflowRun.objects.filter(
            id__in=list(revisions.values())
        ).values_list("id", "created_at")
    }
    due = _due_tasks_queued(set(revisions.values()))
    phases: dict[str, list[float]] = {
        k: []
        for k in ("whole", "round trip", "queued→admitted", "admitted→agent", "late")
    }
    for item, run_id in revisions.items():
        sent, returned = posts[item]
        phases["round trip"].append(1000 * (returned - sent))
        if run_id not in agents:
            continue
        phases["whole"].append(1000 * (agents[run_id] - returned))
        phases["admitted→agent"].append(1000 * (agents[run_id] - admitted[run_id]))
        queued = due.get(run_id)
        if queued is not None:
            phases["queued→admitted"].append(1000 * (admitted[run_id] - queued))
        if queued is None or not sent - SLACK <= queued <= returned + SLACK:
            # Admitted by a due task the webhook did not queue (or none found).
            phases["late"].append(1000 * (admitted[run_id] - returned))
    return phases


def _print_state(logs: tuple[Path, ...]) -> None:
    """What the ledger and the queue hold, and the logs' tails, when the benchmark gives up."""
    from django.db.models import Count
    from django_q.models import OrmQ, Task

    from ledger.models import WorkflowRun, WorkItemRevision

    runs = WorkflowRun.objects.values("status").annotate(n=Count("id"))
    revisions = WorkItemRevision.objects.values("state").annotate(n=Count("id"))
    tasks = Task.objects.values("func", "success").annotate(n=Count("id"))
    print(f"runs {list(runs)}\nrevisions {list(revisions)}\ntasks {list(tasks)}")
    print(f"queued tasks {OrmQ.objects.count()}")
    for log in logs:
        print(f"{log.name} (last 3,000 characters):\n{log.read_text()[-3000:]}")


def _measure(
    work: Path, project: Path, url: str, forge: Any
) -> tuple[dict[str, list[float]], list[float], dict[str, int]]:
    """The first rounds, then one review per item: (the revision path's phases in ms, the
    route=now floor in ms, what the rounds did: `_outcome`)."""
    first = _first_rounds(project)
    pulls = _pull_requests(list(first))
    posts: dict[str, tuple[float, float]] = {}
    for item, number in pulls.items():
        posts[item] = _post_review(url, forge, number)
        time.sleep(PACE)
    revisions = _revision_runs(list(pulls))
    agents = _agent_starts(work / "records")
    floor = [1000 * (agents[r] - first[r]) for r in first if r in agents]
    outcome = _outcome(revisions, pulls, forge)
    return _phases(posts, revisions, agents), floor, outcome


def _outcome(
    revisions: dict[str, str], pulls: dict[str, int], forge: Any
) -> dict[str, int]:
    """Whether the rounds did what a revision does (not timed): each delivered to its
    item's pull request, and no pull request was opened for them."""
    runs = harness.wait_for(
        lambda: _ended(list(revisions.values())),
        timeout=600,
        what="the rounds' deliveries",
    )
    same = sum(
        1
        for r in runs
        if (r.delivery_json or {}).get("state") == "delivered"
        and (r.delivery_json.get("pr") or {}).get("number")
        == pulls[str(r.work_item_id)]
    )
    opened = sum(
        1
        for r in list(forge.requests)
        if r["method"] == "POST"
        and r["path"] == f"/repos/{REPO}/pulls"
        and r["status"] == 201
    )
    return {"updated": same, "opened": opened}


def _start_processes(
    work: Path, port: int
) -> tuple[list[subprocess.Popen[bytes]], tuple[Path, ...]]:
    logs = (work / "main.log", work / "runs.log", work / "web.log")
    main_env = harness.child_env()
    main_env.update(Q_WORKERS="2")
    procs = [
        harness.start_qcluster(main_env, logs[0]),
        start_run_cluster(work / "records", logs[1]),
        _start_web(port, logs[2]),
    ]
    return procs, logs


def run(db: harness.BenchDatabase) -> None:
    from tests.forge_standin import start_forge

    report = harness.Report(
        NAME, f"Review webhook to the revision's agent start, {ITEMS} items", db.vendor
    )
    work = db.workdir
    (work / "records").mkdir()
    project, origin = _project(db.projects_dir, work)
    forge, server = start_forge(remote_git_dir=str(origin))
    _children_env(work, forge.url)
    port = _free_port()
    url = f"http://127.0.0.1:{port}/hooks/github/"
    procs, logs = _start_processes(work, port)
    try:
        harness.wait_for(lambda: _answers(url), timeout=120, what="the web server")
        phases, floor, outcome = _measure(work, project, url, forge)
    except SystemExit:
        _print_state(logs)
        raise
    finally:
        for proc in reversed(procs):
            harness.stop_process_group(proc)
        server.shutdown()
        server.server_close()
    _report(report, phases, floor, outcome)
    report.finish()


def _stats(ms: list[float]) -> list[Any]:
    return [
        len(ms),
        harness.median(ms),
        harness.percentile(ms, 95),
        max(ms, default=float("nan")),
    ]


def _report(
    report: harness.Report,
    phases: dict[str, list[float]],
    floor: list[float],
    outcome: dict[str, int],
) -> None:
    whole = phases["whole"]
    report.table(
        "→ first agent process of the run (ms)",
        ["path", "n", "median", "p95", "max"],
        [
            ["review webhook (from the POST's return)", *_stats(whole)],
            ["route=now (the first rounds: the floor)", *_stats(floor)],
        ],
    )
    report.table(
        "the review path's phases (ms)",
        ["phase", "n", "median", "p95", "max"],
        [
            [
                "the POST's round trip (before the figure)",
                *_stats(phases["round trip"]),
            ],
            [
                "due task queued → run admitted (main cluster pick-up, forge read, admission)",
                *_stats(phases["queued→admitted"]),
            ],
            [
                "run admitted → agent started (run cluster pick-up, worktree)",
                *_stats(phases["admitted→agent"]),
            ],
        ],
    )
    p95 = harness.percentile(whole, 95)
    report.figure(
        "review webhook → agent start: p95", round(p95, 1), "ms", "≤ 2000", p95 <= 2000
    )
    report.figure(
        "review webhook → agent start: median", round(harness.median(whole), 1), "ms"
    )
    report.figure(
        "review webhook → agent start: max",
        round(max(whole, default=float("nan")), 1),
        "ms",
    )
    report.figure("revisions started", len(whole), "", str(ITEMS), len(whole) == ITEMS)
    report.figure(
        "route=now → agent start: median (floor, same run)",
        round(harness.median(floor), 1),
        "ms",
    )
    report.figure(
        "review median / route=now median",
        round(harness.median(whole) / harness.median(floor), 2),
        "x",
    )
    late = len(phases["late"])
    report.figure(
        "rounds not admitted by the due task their webhook queued",
        late,
        "",
        "0",
        late == 0,
    )
    report.figure(
        "rounds delivered to their item's pull request",
        outcome["updated"],
        "",
        str(ITEMS),
        outcome["updated"] == ITEMS,
    )
    report.figure(
        "pull requests opened (the first rounds only)",
        outcome["opened"],
        "",
        str(ITEMS),
        outcome["opened"] == ITEMS,
    )
    report.data.update(phases=phases, floor=floor)
    report.note(
        f"one host; main cluster 2 workers, run cluster 8, web server `runserver --noreload`, "
        f"broker poll 0.5 s; LOOPSWEB_REVISION_DEBOUNCE_SECONDS=0 (a review is due at once); "
        f"one project, {ITEMS} items, each delivered as a pull request first; reviews "
        f"{PACE} s apart (one revision in flight at a time); the GitHub stand-in in the "
        "benchmark's process; the fake agent exits at once."
    )


if __name__ == "__main__":
    harness.main(NAME, run)
