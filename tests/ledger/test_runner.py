"""The runner with real processes (the fake agent), in this process, on both databases."""

from __future__ import annotations

import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from ledger import services
from ledger.claims import UNCONFIRMED_LONGEST
from ledger.models import (
    AccountCooldown,
    LoopStatus,
    RunStatus,
    SpecStatus,
    StepReasonCode,
    StepStatus,
    WorkflowRun,
    WorkItemStatus,
)
from ledger.selectors import account_load
from ledger.services import account_add
from routing.admission import CREATED
from runs.runner import NOT_CLAIMED, run_workflow_run
from tests.ledger.runner_helpers import (
    FAKE_AGENT,
    FakeAgent,
    admit_workflow,
    agent_step,
    command_step,
    event_types,
    process_alive,
    route_generic,
    steps_of,
    wait_for,
)
from tests.waiting import hang_deadline

pytestmark = [pytest.mark.django_db, pytest.mark.slow]
# How long the fake agent would run by itself in the tests that kill its step: a hang
# deadline, so a step that ended before it was killed, however busy the machine.
AGENT_OWN_END = round(hang_deadline(120))


def test_an_admitted_route_runs_worker_then_verifier_on_their_accounts_and_cascades(
    agent: FakeAgent, tmp_path: Path
) -> None:
    result = route_generic(tmp_path, auth_profile_pool=["acctA", "acctB"])
    assert result.kind == CREATED and result.run is not None
    run = result.run

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED

    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED and run.error is None
    assert run.started_at and run.finished_at and run.duration_ms is not None
    assert run.lease_expires_at is None and run.claimed_by == services.worker_identity()
    steps = steps_of(run)
    records = agent.records()
    # Order: the worker ran first, the verifier after it (it depends on the worker).
    assert [r["step"] for r in records] == ["worker", "verifier"]
    for record in records:
        step = steps[record["step"]]
        assert step.status == StepStatus.SUCCEEDED
        # The step's pid leads its process group: the step guard (agents.stepguard), the
        # agent's parent.
        assert step.exit_code == 0 and step.pid == record["pgid"] != record["pid"]
        assert step.duration_ms is not None and step.started_at and step.finished_at
        assert "FAKE_AGENT_ARGV" in step.stdout
        # Attribution: the account the ledger records is the account the agent ran on.
        assert step.account_profile == record["profile"]
        assert step.account_tool == "codewith"
        assert record["argv"][:5] == [
            "exec",
            "--sandbox",
            "workspace-write",
            "--profile",
            step.account_profile,
        ]
        assert record["cwd"] == str(tmp_path)
    # Pool routing put the two roles on different accounts.
    assert {steps["worker"].account_profile, steps["verifier"].account_profile} == {
        "acctA",
        "acctB",
    }
    assert steps["verifier"].started_at >= steps["worker"].finished_at

    item = run.work_item
    item.refresh_from_db()
    assert item.status == WorkItemStatus.SUCCEEDED and item.lease_expires_at is None
    assert item.workflow_run_id == run.id
    loop = run.loop
    loop.refresh_from_db()
    assert loop.status == LoopStatus.STOPPED and loop.next_run_at is None
    spec = run.workflow
    spec.refresh_from_db()
    assert spec.status == SpecStatus.ARCHIVED
    events = event_types(run)
    assert [seq for seq, _, _ in events] == list(range(1, len(events) + 1))
    assert [(t, s) for _, t, s in events] == [
        ("created", None),
        ("claimed", None),
        ("step_started", "worker"),
        ("step_succeeded", "worker"),
        ("step_started", "verifier"),
        ("step_succeeded", "verifier"),
        ("succeeded", None),
        ("workflow_archived", None),
    ]
    archived = run.events.get(event_type="workflow_archived")
    assert (
        archived.payload_json["reason"] == "terminal generated one-shot route workflow"
    )
    assert account_load().total() == {}


def test_a_second_delivery_of_the_same_run_does_nothing(
    agent: FakeAgent, tmp_path: Path
) -> None:
    run = admit_workflow([agent_step("worker", cwd=tmp_path)])
    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED
    events_before = event_types(run)

    assert run_workflow_run(run.id) == NOT_CLAIMED
    assert services.run_claim(run_id=run.id, worker="other:1") is None

    assert event_types(run) == events_before
    assert len(agent.records()) == 1


def test_a_failing_step_fails_the_run_skips_the_rest_and_fails_the_item(
    agent: FakeAgent, tmp_path: Path
) -> None:
    agent.configure(steps={"worker": {"exit": 3, "stderr": "boom"}})
    result = route_generic(tmp_path, auth_profile="acctA")
    run = result.run

    assert run_workflow_run(run.id) == RunStatus.FAILED

    run.refresh_from_db()
    steps = steps_of(run)
    assert steps["worker"].status == StepStatus.FAILED
    assert steps["worker"].exit_code == 3 and "boom" in steps["worker"].stderr
    # The agent's own last stderr line, with the exit code after it (agents.agent_output).
    assert steps["worker"].error == "boom (exit code 3)"
    assert steps["verifier"].status == StepStatus.SKIPPED
    assert steps["verifier"].started_at is None
    assert run.error == "step worker failed: boom (exit code 3)"
    item = run.work_item
    item.refresh_from_db()
    assert item.status == WorkItemStatus.FAILED
    assert item.last_reason == run.error
    # Generated one-shot specs are archived whatever the outcome (no loop retry is left).
    run.workflow.refresh_from_db()
    assert run.workflow.status == SpecStatus.ARCHIVED
    assert [r["step"] for r in agent.records()] == ["worker"]


def test_a_step_past_its_timeout_is_killed_with_its_whole_process_group(
    agent: FakeAgent, tmp_path: Path
) -> None:
    # The agent ignores SIGTERM (so SIGKILL must follow) and has a grandchild; by itself it
    # would run for a hang deadline (AGENT_OWN_END s), so it ended before that: killed.
    agent.configure(
        default={"sleep": AGENT_OWN_END, "ignore_term": True, "spawn_child": True}
    )
    run = admit_workflow(
        [
            agent_step("worker", cwd=tmp_path, timeoutMs=1200),
            agent_step("verifier", cwd=tmp_path, depends_on=["worker"]),
        ]
    )
    assert run_workflow_run(run.id) == RunStatus.TIMED_OUT

    run.refresh_from_db()
    steps = steps_of(run)
    worker = steps["worker"]
    assert worker.status == StepStatus.TIMED_OUT
    # The limit, then the last thing the step printed (the output seen so far).
    assert worker.error.startswith("step timed out after 1200 ms; last output: ")
    assert worker.exit_code is None
    assert 1200 <= worker.duration_ms < AGENT_OWN_END * 1000
    assert steps["verifier"].status == StepStatus.SKIPPED
    assert run.error.startswith("step worker timed_out: step timed out after 1200 ms")
    run.work_item.refresh_from_db()
    assert run.work_item.status == WorkItemStatus.FAILED
    (record,) = agent.records()
    assert not process_alive(record["pid"])
    assert record["child_pid"]
    wait_for(
        lambda: not process_alive(record["child_pid"]), timeout=30, what="grandchild"
    )


def test_a_step_that_stays_silent_past_its_idle_timeout_is_killed_but_a_chatty_one_is_not(
    agent: FakeAgent, tmp_path: Path
) -> None:
    agent.configure(
        steps={
            "chatty": {"sleep": 1.5, "tick": 0.15},
            "silent": {"sleep": AGENT_OWN_END},
        }
    )
    run = admit_workflow(
        [
            agent_step("chatty", cwd=tmp_path, idleTimeoutMs=1000),
            agent_step(
                "silent", cwd=tmp_path, depends_on=["chatty"], idleTimeoutMs=1000
            ),
        ]
    )

    assert run_workflow_run(run.id) == RunStatus.TIMED_OUT

    steps = steps_of(run)
    assert steps["chatty"].status == StepStatus.SUCCEEDED
    assert steps["chatty"].duration_ms >= 1500
    assert "fake-agent working (5)" in steps["chatty"].stdout
    silent = steps["silent"]
    assert silent.status == StepStatus.TIMED_OUT
    assert silent.error.startswith("no progress for 1.0 s (idle limit); last output: ")
    # It printed its argv line at start, then nothing: killed after its idle second, long
    # before it would have ended by itself.
    assert 1000 <= silent.duration_ms < AGENT_OWN_END * 1000


def test_steps_run_in_dependency_order_not_list_order(
    tmp_path: Path, agent: FakeAgent
) -> None:
    log = tmp_path / "order.log"
    append = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + chr(10))"

    def step(step_id: str, depends_on: list[str] | None) -> dict[str, Any]:
        return command_step(
            step_id,
            sys.executable,
            "-c",
            append,
            str(log),
            step_id,
            depends_on=depends_on,
        )

    run = admit_workflow(
        [
            step("deploy", ["test", "build"]),
            step("test", ["build"]),
            step("lint", None),
            step("build", ["lint"]),
        ],
        template_id=None,  # a hand-made workflow, not a generated route template
    )

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED

    assert log.read_text().split() == ["lint", "build", "test", "deploy"]
    steps = steps_of(run)
    assert all(s.status == StepStatus.SUCCEEDED for s in steps.values())
    # Command steps carry no account unless they name one.
    assert {(s.account_profile, s.account_tool) for s in steps.values()} == {
        (None, None)
    }
    # Hand-made workflows are never archived automatically (docs/upstream.md §2.3).
    run.workflow.refresh_from_db()
    assert run.workflow.status == SpecStatus.ACTIVE
    assert not run.events.filter(event_type="workflow_archived").exists()


def test_an_unknown_dependency_or_a_cycle_fails_the_run_before_anything_starts(
    agent: FakeAgent, tmp_path: Path
) -> None:
    cyclic = admit_workflow(
        [
            command_step("a", "true", depends_on=["b"]),
            command_step("b", "true", depends_on=["a"]),
        ]
    )
    unknown = admit_workflow([command_step("a", "true", depends_on=["nope"])])

    assert run_workflow_run(cyclic.id) == RunStatus.FAILED
    assert run_workflow_run(unknown.id) == RunStatus.FAILED

    cyclic.refresh_from_db()
    unknown.refresh_from_db()
    assert cyclic.error == "workflow cannot run: dependency cycle among steps: a, b"
    assert unknown.error == "workflow cannot run: step a depends on unknown step nope"
    for run in (cyclic, unknown):
        assert {s.status for s in steps_of(run).values()} == {StepStatus.SKIPPED}
        assert all(s.started_at is None for s in steps_of(run).values())


def test_command_steps_take_argv_literally_and_use_a_shell_only_when_asked(
    agent: FakeAgent, tmp_path: Path
) -> None:
    marker = tmp_path / "from-argv"
    shell_out = tmp_path / "from-shell"
    run = admit_workflow(
        [
            command_step(
                "argv",
                sys.executable,
                "-c",
                "import sys, os; print(sys.argv[1]); print(os.environ['GREETING'])",
                f"$(touch {marker})",
                env={"GREETING": "hello `id`"},
                cwd=tmp_path,
            ),
            command_step(
                "shell",
                f"echo $((40 + 2)) > {shell_out}",
                shell=True,
                depends_on=["argv"],
                cwd=tmp_path,
            ),
        ]
    )

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED

    steps = steps_of(run)
    assert steps["argv"].stdout == f"$(touch {marker})\nhello `id`\n"
    assert not marker.exists()
    assert shell_out.read_text() == "42\n"


def test_event_text_with_shell_metacharacters_reaches_the_agent_literally(
    agent: FakeAgent, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    keep = tmp_path / "keep"
    keep.mkdir()
    pwned = [tmp_path / f"pwned{i}" for i in range(4)]
    title = f"$(touch {pwned[0]}) `touch {pwned[1]}`; rm -rf {keep}"
    message = (
        f"details && touch {pwned[2]} | sh; $(touch {pwned[3]})\n-- --help\n'\"$HOME"
    )
    result = route_generic(project, title=title, message=message, auth_profile="acctA")

    assert run_workflow_run(result.run.id) == RunStatus.SUCCEEDED

    records = agent.records()
    assert len(records) == 2
    for record in records:
        assert title in record["prompt"] and message in record["prompt"]
        # The prompt is one argv item, after `--`.
        assert record["argv"][-2] == "--" and record["argv"][-1] == record["prompt"]
    assert not any(p.exists() for p in pwned)
    assert keep.is_dir()


@pytest.mark.parametrize(
    ("provider", "argv_head", "profile_env"),
    [
        (
            "codewith",
            ["exec", "--sandbox", "workspace-write", "--profile", "acct-1"],
            "CODEWITH_PROFILE",
        ),
        # Registered accounts: the variable the CLI reads to find its login.
        ("codex", ["exec", "--json", "--sandbox", "workspace-write"], "CODEX_HOME"),
        (
            "claude",
            ["--print", "--output-format", "stream-json", "--verbose"]
            + ["--permission-mode", "acceptEdits"],
            "CLAUDE_CONFIG_DIR",
        ),
        ("cursor", ["--print"], "HOME"),
        ("opencode", ["run", "--format", "json", "--print-logs"], "XDG_DATA_HOME"),
        ("aicopilot", ["--prompt-file"], "AICOPILOT_PROFILE"),
    ],
)
def test_each_provider_gets_its_argv_account_and_no_database_secrets(
    agent: FakeAgent,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    provider: str,
    argv_head: list[str],
    profile_env: str,
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgres://secret@db/x")
    monkeypatch.setenv("SECRET_KEY", "do-not-leak")
    expected = "acct-1"
    if not profile_env.endswith("_PROFILE"):
        expected = str(tmp_path / "logins" / "acct-1")
        account_add(name="acct-1", provider=provider, env={profile_env: expected})
    prompt = "-starts with a dash; $(touch nope)"
    run = admit_workflow(
        [
            agent_step(
                "worker",
                cwd=tmp_path,
                provider=provider,
                profile="acct-1",
                prompt=prompt,
            )
        ]
    )

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED

    (record,) = agent.records()
    assert record["argv"][: len(argv_head)] == argv_head
    assert record["prompt"] == prompt
    assert record["env"][profile_env] == expected
    assert record["env"]["LOOPSWEB_ACCOUNT_PROFILE"] == "acct-1"
    assert record["env"]["LOOPSWEB_ACCOUNT_TOOL"] == provider
    assert record["env"]["LOOPSWEB_RUN_ID"] == run.id
    assert "DATABASE_URL" not in record["env"] and "SECRET_KEY" not in record["env"]
    step = steps_of(run)["worker"]
    assert (step.account_profile, step.account_tool) == ("acct-1", provider)
    if provider == "aicopilot":
        # The prompt file existed only for the step's lifetime.
        assert not Path(record["argv"][1]).exists()
    assert not (tmp_path / "nope").exists()


def test_a_prompt_file_is_private_to_the_agent(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    probe = tmp_path / "mode"
    # A wrapper records the prompt file's mode, then hands over to the fake agent.
    wrapper = tmp_path / "aicopilot-wrapper"
    wrapper.write_text(
        f'#!/bin/sh\nstat -c %a "$2" > {probe}\nexec {FAKE_AGENT} "$@"\n'
    )
    wrapper.chmod(0o755)
    settings.LOOPSWEB_PROVIDER_BINARIES = {"aicopilot": str(wrapper)}
    run = admit_workflow(
        [agent_step("worker", cwd=tmp_path, provider="aicopilot", profile="p")]
    )

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED

    assert probe.read_text().strip() == "600"
    (record,) = agent.records()
    assert record["prompt"] == "Do the worker part."
    assert not Path(record["argv"][1]).parent.exists()


def test_a_missing_binary_or_working_directory_fails_the_step_with_a_clear_error(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    settings.LOOPSWEB_PROVIDER_BINARIES = {"claude": str(tmp_path / "no-such-claude")}
    no_binary = admit_workflow([agent_step("worker", cwd=tmp_path, provider="claude")])
    no_cwd = admit_workflow([command_step("c", "true", cwd=tmp_path / "gone")])

    assert run_workflow_run(no_binary.id) == RunStatus.FAILED
    assert run_workflow_run(no_cwd.id) == RunStatus.FAILED

    assert steps_of(no_binary)["worker"].error == (
        f"agent binary not found for provider claude: {tmp_path / 'no-such-claude'} "
        "(set LOOPSWEB_CLAUDE_BIN)"
    )
    assert (
        steps_of(no_cwd)["c"].error
        == f"working directory does not exist: {tmp_path / 'gone'}"
    )


def test_output_is_kept_as_a_bounded_tail(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    settings.LOOPSWEB_OUTPUT_TAIL_BYTES = 2048
    run = admit_workflow(
        [
            command_step(
                "noisy",
                sys.executable,
                "-c",
                "import sys\nfor i in range(5000): print(f'line {i:05d}')\nprint('the end', file=sys.stderr)",
            )
        ]
    )

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED

    step = steps_of(run)["noisy"]
    assert step.stdout.startswith("[... ")
    assert step.stdout.endswith("line 04999\n")
    assert len(step.stdout.encode()) < 2048 + 100
    assert step.stderr == "the end\n"


# --- the account re-check at step start -------------------------------------------------------


def test_a_step_does_not_start_while_its_account_is_at_its_cap_and_says_why_once(
    agent: FakeAgent, tmp_path: Path
) -> None:
    busy = admit_workflow([agent_step("worker", cwd=tmp_path, profile="acctA")])
    services.run_claim(run_id=busy.id, worker="w:1")
    busy_step = steps_of(busy)["worker"]
    assert services.step_start(step_run_id=busy_step.id, worker="w:1").started

    run = admit_workflow(
        [agent_step("worker", cwd=tmp_path, profile="acctA", max_per_profile=1)]
    )
    services.run_claim(run_id=run.id, worker="w:2")
    step = steps_of(run)["worker"]
    first = services.step_start(step_run_id=step.id, worker="w:2")
    second = services.step_start(step_run_id=step.id, worker="w:2")

    assert not first.started and not second.started
    assert first.wait_code == "profile_cap"
    assert first.wait_reason == "account acctA is at capacity (1/1 running steps)"
    step.refresh_from_db()
    assert step.status == StepStatus.PENDING
    waiting = run.events.filter(event_type="step_waiting")
    assert waiting.count() == 1 and waiting.get().payload_json["code"] == "profile_cap"

    # The slot frees: the step starts.
    services.step_finish(
        step_run_id=busy_step.id, status=StepStatus.SUCCEEDED, exit_code=0
    )
    assert services.step_start(step_run_id=step.id, worker="w:2").started
    # Without a cap on the step (no pool routing), the same account may carry more.
    other = admit_workflow([agent_step("worker", cwd=tmp_path, profile="acctA")])
    services.run_claim(run_id=other.id, worker="w:3")
    assert services.step_start(
        step_run_id=steps_of(other)["worker"].id, worker="w:3"
    ).started


def test_the_runner_waits_for_a_cooling_account_then_runs(
    agent: FakeAgent, tmp_path: Path
) -> None:
    until = timezone.now() + timedelta(seconds=0.6)
    AccountCooldown.objects.create(account_profile="acctA", until=until, reason="429")
    run = admit_workflow([agent_step("worker", cwd=tmp_path, profile="acctA")])

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED

    step = steps_of(run)["worker"]
    assert step.started_at >= until
    waiting = run.events.get(event_type="step_waiting")
    assert waiting.payload_json["code"] == "cooldown"
    assert waiting.payload_json["reason"].startswith(
        "account acctA is cooling down until "
    )


def test_a_step_cannot_start_for_another_worker_or_on_a_finished_run(
    agent: FakeAgent, tmp_path: Path
) -> None:
    run = admit_workflow([agent_step("worker", cwd=tmp_path)])
    step = steps_of(run)["worker"]
    with pytest.raises(services.LedgerError, match="workflow step is not claimable"):
        services.step_start(step_run_id=step.id, worker="w:1")  # still queued
    services.run_claim(run_id=run.id, worker="w:1")
    with pytest.raises(services.LedgerError, match="workflow step is not claimable"):
        services.step_start(step_run_id=step.id, worker="w:other")
    services.run_finalize(run_id=run.id, status=RunStatus.CANCELLED, error="stop")
    with pytest.raises(
        services.LedgerError, match=r"status=cancelled \(run cancelled\)"
    ):
        services.step_start(step_run_id=step.id, worker="w:1")


# --- rate limits --------------------------------------------------------------------------------


def test_a_rate_limited_step_cools_its_account_until_the_named_time(
    agent: FakeAgent, tmp_path: Path
) -> None:
    agent.configure(
        profiles={
            "acctA": {
                "rate_limit": "Error: HTTP 429 Too Many Requests\nRetry-After: 120"
            }
        }
    )
    run = admit_workflow([agent_step("worker", cwd=tmp_path, profile="acctA")])
    before = timezone.now()

    assert run_workflow_run(run.id) == RunStatus.FAILED

    after = timezone.now()
    cooldown = AccountCooldown.objects.get(account_profile="acctA")
    step = steps_of(run)["worker"]
    assert before + timedelta(seconds=120) <= cooldown.until
    assert cooldown.until <= after + timedelta(seconds=120)
    assert cooldown.reports == 1 and cooldown.step_run_id == step.id
    assert cooldown.account_tool == "codewith"
    assert "HTTP 429 Too Many Requests" in cooldown.reason and run.id in cooldown.reason
    assert step.error == (
        "Retry-After: 120 (exit code 1); provider rate limit: Error: HTTP 429 Too Many Requests"
    )
    assert step.reason_code == StepReasonCode.RATE_LIMITED  # what /metrics counts


def test_a_usage_limit_names_its_reset_time_and_overlapping_reports_keep_the_latest_deadline(
    agent: FakeAgent, tmp_path: Path
) -> None:
    reset = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    agent.configure(
        steps={
            "a": {
                "rate_limit": f"You have hit your usage limit. It resets at {reset:%Y-%m-%dT%H:%M:%SZ}."
            },
            "b": {
                "rate_limit": "rate limit exceeded, try again in 5 minutes",
                "exit": 2,
            },
        }
    )
    first = admit_workflow([agent_step("a", cwd=tmp_path, profile="acctA")])
    second = admit_workflow([agent_step("b", cwd=tmp_path, profile="acctB")])

    started = timezone.now()
    run_workflow_run(first.id)
    before = timezone.now()
    run_workflow_run(second.id)
    after = timezone.now()

    # Two hours claimed by a step: recorded for at most 15 minutes, "unconfirmed", until
    # loopsweb's own request confirms it (ledger/claims.py; the request is queued).
    capped = AccountCooldown.objects.get(pk="acctA")
    assert started + UNCONFIRMED_LONGEST <= capped.until <= before + UNCONFIRMED_LONGEST
    assert "unconfirmed" in capped.reason and f"{reset:%Y-%m-%dT%H:%M}" in capped.reason
    reset = capped.until
    # "in 5 minutes" from when the step said it.
    b_until = AccountCooldown.objects.get(pk="acctB").until
    assert before + timedelta(minutes=5) <= b_until <= after + timedelta(minutes=5)

    # acctA reports again with an earlier deadline: the later one stays, with its reason.
    services.account_cooldown_record(
        profile="acctA",
        tool="codewith",
        until=timezone.now() + timedelta(minutes=1),
        reason="near",
    )
    cooldown = AccountCooldown.objects.get(pk="acctA")
    assert cooldown.until == reset and cooldown.reports == 2
    assert "unconfirmed" in cooldown.reason and cooldown.step_run is not None
    # A later deadline replaces it.
    far = timezone.now() + timedelta(hours=5)
    services.account_cooldown_record(
        profile="acctA", tool="codewith", until=far, reason="far"
    )
    cooldown.refresh_from_db()
    assert cooldown.until == far and cooldown.reason == "far" and cooldown.reports == 3


def test_rate_limit_text_after_a_successful_step_does_not_cool_the_account(
    agent: FakeAgent, tmp_path: Path
) -> None:
    agent.configure(
        default={"output": "Added a rate limit of 10 requests (HTTP 429) to the API."}
    )
    run = admit_workflow([agent_step("worker", cwd=tmp_path, profile="acctA")])

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED
    assert not AccountCooldown.objects.exists()


def test_a_provider_rate_limit_exit_code_cools_the_account_with_backoff(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    settings.LOOPSWEB_RATE_LIMIT_EXIT_CODES = {"claude": frozenset({42})}
    settings.LOOPSWEB_COOLDOWN_BASE_SECONDS = 30
    agent.configure(default={"exit": 42})
    runs = [
        admit_workflow(
            [agent_step("worker", cwd=tmp_path, provider="claude", profile="c1")]
        )
        for _ in range(2)
    ]

    run_workflow_run(runs[0].id)
    first = AccountCooldown.objects.get(pk="c1")
    AccountCooldown.objects.filter(pk="c1").update(until=timezone.now())  # cooled down
    run_workflow_run(runs[1].id)
    second = AccountCooldown.objects.get(pk="c1")

    assert first.reports == 1 and second.reports == 2
    first_delay = (first.until - first.updated_at).total_seconds()
    second_delay = (second.until - second.updated_at).total_seconds()
    assert 29 <= first_delay <= 31 and 59 <= second_delay <= 61
    assert first.account_tool == "claude"


def test_after_a_rate_limit_the_next_admission_avoids_the_account_and_defers_when_all_cool(
    agent: FakeAgent, tmp_path: Path, settings: Any
) -> None:
    settings.LOOPSWEB_RATE_LIMIT_MOVES = (
        0  # admission's side only: the step never moves
    )
    limited = "429 Too Many Requests"
    agent.configure(
        profiles={"acctA": {"rate_limit": limited}, "acctB": {"rate_limit": limited}}
    )
    pool = ["acctA", "acctB"]
    first = route_generic(tmp_path, auth_profile_pool=pool)
    cooled = steps_of(first.run)["worker"].account_profile
    other = ({"acctA", "acctB"} - {cooled}).pop()

    assert run_workflow_run(first.run.id) == RunStatus.FAILED
    assert set(AccountCooldown.objects.values_list("pk", flat=True)) == {cooled}

    second = route_generic(tmp_path, auth_profile_pool=pool)
    assert second.kind == CREATED
    # The worker takes the free account; the verifier never shares it (worker != verifier):
    # it is planned on the cooling one and waits for it when it starts.
    roles = {k: s.account_profile for k, s in steps_of(second.run).items()}
    assert roles == {"worker": other, "verifier": cooled}

    services.account_cooldown_record(
        profile=other,
        tool="codewith",
        until=timezone.now() + timedelta(minutes=10),
        reason="429",
    )
    third = route_generic(tmp_path, auth_profile_pool=pool)
    assert third.kind == "throttled" and third.reason_code == "cooldown"
    first_free = AccountCooldown.objects.get(pk=cooled).until
    assert third.reason.endswith(f"until {first_free:%Y-%m-%dT%H:%M:%SZ}")
    third.work_item.refresh_from_db()
    assert third.work_item.status == WorkItemStatus.DEFERRED


# --- cancel and recovery in-process -------------------------------------------------------------


def test_recovery_fails_expired_running_runs_and_leaves_queued_and_live_ones(
    agent: FakeAgent, tmp_path: Path
) -> None:
    now = timezone.now()
    expired = admit_workflow(
        [
            agent_step("worker", cwd=tmp_path),
            agent_step("verifier", cwd=tmp_path, depends_on=["worker"]),
        ]
    )
    services.run_claim(
        run_id=expired.id, worker="gone-host:99", now=now - timedelta(minutes=5)
    )
    services.step_start(
        step_run_id=steps_of(expired)["worker"].id, worker="gone-host:99"
    )
    WorkflowRun.objects.filter(pk=expired.id).update(
        lease_expires_at=now - timedelta(seconds=1)
    )
    live = admit_workflow([agent_step("worker", cwd=tmp_path, profile="acctL")])
    services.run_claim(run_id=live.id, worker="w:1", now=now)
    queued = admit_workflow([agent_step("worker", cwd=tmp_path, profile="acctQ")])
    assert account_load().running == {"acctA": 1}

    planned = services.runs_recover_expired(now=now, dry_run=True)
    assert [r.run_id for r in planned] == [expired.id]
    expired.refresh_from_db()
    assert expired.status == RunStatus.RUNNING  # the dry run wrote nothing

    (recovered,) = services.runs_recover_expired(now=now)

    assert recovered.failed_steps == ["worker"] and recovered.skipped_steps == [
        "verifier"
    ]
    assert recovered.killed_pids == []  # no process on this host
    expired.refresh_from_db()
    assert expired.status == RunStatus.FAILED
    assert (
        expired.error
        == "workflow run lease expired before completion (claimed_by=gone-host:99)"
    )
    steps = steps_of(expired)
    assert steps["worker"].status == StepStatus.FAILED
    assert (
        steps["worker"].error
        == "worker lease expired before completion (claimed_by=gone-host:99)"
    )
    assert steps["worker"].reason_code == StepReasonCode.FAILED
    assert steps["verifier"].status == StepStatus.SKIPPED
    assert steps["verifier"].reason_code == StepReasonCode.NONE
    item = expired.work_item
    item.refresh_from_db()
    assert item.status == WorkItemStatus.FAILED
    assert item.last_reason == "parent loop run lease expired before completion"
    assert account_load().running == {}
    assert "acctA" not in account_load().total()
    live.refresh_from_db()
    queued.refresh_from_db()
    assert live.status == RunStatus.RUNNING and queued.status == RunStatus.QUEUED
    assert services.runs_recover_expired(now=now) == []


def test_a_cancelled_queued_run_is_never_claimed(
    agent: FakeAgent, tmp_path: Path
) -> None:
    run = admit_workflow([agent_step("worker", cwd=tmp_path)])
    services.run_cancel(run_id=run.id, reason="not needed")

    assert run_workflow_run(run.id) == NOT_CLAIMED

    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.error == "not needed"
    assert steps_of(run)["worker"].status == StepStatus.CANCELLED
    run.work_item.refresh_from_db()
    assert run.work_item.status == WorkItemStatus.CANCELLED
    assert run.work_item.last_reason == "not needed"
    assert agent.records() == []


def test_signal_death_is_recorded_as_a_failure(
    agent: FakeAgent, tmp_path: Path
) -> None:
    run = admit_workflow(
        [
            command_step(
                "die",
                sys.executable,
                "-c",
                f"import os; os.kill(os.getpid(), {int(signal.SIGTERM)})",
            )
        ]
    )
    assert run_workflow_run(run.id) == RunStatus.FAILED
    step = steps_of(run)["die"]
    assert step.error == "step was killed by signal SIGTERM" and step.exit_code is None


def test_a_relative_binary_path_is_resolved_before_the_step_changes_directory(
    agent: FakeAgent, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(FAKE_AGENT.parent.parent)
    settings.LOOPSWEB_PROVIDER_BINARIES = {"codewith": "scripts/fake-agent"}
    run = admit_workflow([agent_step("worker", cwd=tmp_path)])

    assert run_workflow_run(run.id) == RunStatus.SUCCEEDED
    assert agent.records()[0]["cwd"] == str(tmp_path)
