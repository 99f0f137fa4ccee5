"""Workflow runs, their step runs and their events."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from ledger.models.base import TimestampedModel, id_field
from ledger.models.loops import Loop, LoopRun
from ledger.models.specs import WorkflowInvocation, WorkflowSpec
from ledger.models.statuses import RunStatus, StepReasonCode, StepStatus


class WorkflowRun(TimestampedModel):
    id = id_field()
    workflow = models.ForeignKey(
        WorkflowSpec, on_delete=models.CASCADE, db_index=False, related_name="runs"
    )
    workflow_name = models.CharField(max_length=500)
    loop = models.ForeignKey(
        Loop,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        db_index=False,
        related_name="workflow_runs",
    )
    loop_run = models.ForeignKey(
        LoopRun,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        db_index=False,
        related_name="workflow_runs",
    )
    invocation = models.ForeignKey(
        WorkflowInvocation,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        db_index=False,
        db_constraint=False,  # upstream keeps this a plain id column
        related_name="runs",
    )
    work_item = models.ForeignKey(
        "WorkflowWorkItem",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        db_index=False,
        db_constraint=False,  # upstream keeps this a plain id column
        related_name="runs",
    )
    scheduled_for = models.DateTimeField(null=True, blank=True)
    idempotency_key = models.CharField(max_length=500, null=True, blank=True)
    manifest_path = models.TextField(null=True, blank=True)
    status = models.CharField(max_length=20, choices=RunStatus.choices)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.BigIntegerField(null=True, blank=True)
    error = models.TextField(null=True, blank=True)
    goal_run_id = models.CharField(max_length=32, null=True, blank=True)
    # loopsweb (0003): the runner's lease. A running run whose lease expired lost its worker;
    # recovery fails it and frees its account and cap slots.
    claimed_by = models.CharField(max_length=200, null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # loopsweb (0005): the run's own git worktree (runs.worktrees), recorded before it is
    # made so a crash never leaves one nobody knows of; removed_at once it is gone.
    worktree_path = models.TextField(null=True, blank=True)
    worktree_branch = models.CharField(max_length=255, null=True, blank=True)
    worktree_removed_at = models.DateTimeField(null=True, blank=True)
    # loopsweb (0010): what the run left on its branch (runs.worktrees.worktree_commit): the
    # branch's head after the agent's uncommitted work was committed, and the diffstat against
    # where the run started ("" : no changes).
    commit_head = models.CharField(max_length=64, null=True, blank=True)
    commit_diffstat = models.TextField(null=True, blank=True)
    # loopsweb (0012): why the work was not committed and where it is kept (the worktree,
    # never pruned then); NULL when it was committed or the run had no worktree.
    commit_error = models.TextField(null=True, blank=True)
    # loopsweb (0011): the host that runs (ran) the run, the host its worktree is on (only
    # that host's prune removes it), and why no host takes it yet (since when): a run no
    # live host serves fails after LOOPSWEB_NO_HOST_GRACE_SECONDS with that reason.
    host = models.CharField(max_length=80, null=True, blank=True)
    worktree_host = models.CharField(max_length=80, null=True, blank=True)
    # loopsweb (0021): the run ended because this host was gone (dead or forgotten) while
    # the run was on it: /ops/hosts/ lists the work lost with a host.
    lost_with_host = models.CharField(max_length=80, null=True, blank=True)
    host_wait_reason = models.TextField(null=True, blank=True)
    host_wait_since = models.DateTimeField(null=True, blank=True)
    # loopsweb (0027): the project a run waits for the hosts to check or to have
    # (ledger.hosts WAIT_CHECKING, WAIT_MISSING in host_wait_code): placement reads these,
    # never the reason's text.
    host_wait_code = models.CharField(max_length=16, null=True, blank=True)
    host_wait_project = models.TextField(null=True, blank=True)
    # loopsweb (0013): hosts that handed the run back since it was last claimed (placement
    # skips them: a hand-back never loops); emptied by the claim.
    hosts_declined = models.JSONField(default=list, null=True, blank=True)
    # loopsweb (0021): what was delivered (runs.delivery: mode, pushed ref and commit, PR
    # number, URL and state, or the delivery's error) and when the work was discarded.
    delivery_json = models.JSONField(null=True, blank=True)
    work_discarded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "workflow_runs"
        constraints = [
            # one run per (workflow, idempotency key): a second create returns the first
            models.UniqueConstraint(
                fields=["workflow", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="idx_workflow_runs_idempotency",
            ),
        ]
        indexes = [
            # a workflow's runs, newest first (spec archive check, admin inline)
            models.Index(
                fields=["workflow", "-created_at"],
                name="idx_workflow_runs_workflow_created",
            ),
            # runs of one loop run
            models.Index(fields=["loop_run"], name="idx_workflow_runs_loop_run"),
            # queued/running runs: the runner's claim and the account-load count
            models.Index(fields=["status"], name="idx_workflow_runs_status"),
            # runs of one invocation (ops pages)
            models.Index(fields=["invocation"], name="idx_workflow_runs_invocation"),
            # runs of one work item (item detail, cascades)
            models.Index(fields=["work_item"], name="idx_workflow_runs_work_item"),
            # lease recovery: running runs whose lease expired
            models.Index(
                fields=["status", "lease_expires_at"],
                name="idx_workflow_runs_status_lease",
            ),
            # worktree prune: runs whose worktree still exists (few), by finish time
            models.Index(
                fields=["finished_at"],
                name="idx_workflow_runs_worktree_open",
                condition=Q(
                    worktree_path__isnull=False, worktree_removed_at__isnull=True
                ),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.workflow_name} [{self.status}]"


class WorkflowStepRun(TimestampedModel):
    id = id_field()
    workflow_run = models.ForeignKey(
        WorkflowRun, on_delete=models.CASCADE, db_index=False, related_name="step_runs"
    )
    step_id = models.CharField(max_length=200)
    sequence = models.IntegerField()
    status = models.CharField(
        max_length=20, choices=StepStatus.choices, default=StepStatus.PENDING
    )
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    duration_ms = models.BigIntegerField(null=True, blank=True)
    stdout = models.TextField(null=True, blank=True)
    stderr = models.TextField(null=True, blank=True)
    error = models.TextField(null=True, blank=True)
    # loopsweb (0022): why it did not succeed (StepReasonCode; "" while pending, running or
    # after success), set by `step_finish`.
    reason_code = models.CharField(
        max_length=20,
        choices=StepReasonCode.choices,
        blank=True,
        default=StepReasonCode.NONE,
        db_default=StepReasonCode.NONE,
    )
    # The account the step ran on (0.4.12): the resolved auth profile and the provider tool.
    account_profile = models.CharField(max_length=200, null=True, blank=True)
    account_tool = models.CharField(max_length=100, null=True, blank=True)
    goal_run_id = models.CharField(max_length=32, null=True, blank=True)
    # loopsweb (0004): usage the agent reported in its machine-readable output (codex
    # --json, claude --output-format json); NULL when it printed none we could read.
    usage_input_tokens = models.BigIntegerField(null=True, blank=True)
    usage_output_tokens = models.BigIntegerField(null=True, blank=True)
    usage_cached_tokens = models.BigIntegerField(null=True, blank=True)
    usage_cost_usd = models.FloatField(null=True, blank=True)
    # loopsweb (0012): processes the step left running that the step guard ended when it
    # ended (agents.stepguard); NULL for a step that ran no process.
    processes_ended = models.PositiveIntegerField(null=True, blank=True)
    # When its agent last made progress (a model answer or a tool call; runs.agent_step).
    progress_at = models.DateTimeField(null=True, blank=True)
    # loopsweb (0021): the commit of what this step changed on the run's branch and its
    # diffstat (runs.step_commits); NULL when the step changed nothing.
    commit_sha = models.CharField(max_length=64, null=True, blank=True)
    commit_diffstat = models.TextField(null=True, blank=True)
    # loopsweb (0025): "host:port" -> connections the step's sandbox refused (agents.egress);
    # NULL when it refused none or the step ran unsandboxed.
    egress_refused = models.JSONField(null=True, blank=True)
    # loopsweb (0028): a verifier's verdict from its last message (agents.verdict):
    # approve, changes or escalate; NULL for any other step. `verdict_text` is what it
    # gave with it (its findings, or why it escalated), bounded.
    verdict = models.CharField(max_length=16, null=True, blank=True)
    verdict_text = models.TextField(null=True, blank=True)

    class Meta:
        db_table = "workflow_step_runs"
        constraints = [
            models.UniqueConstraint(
                fields=["workflow_run", "step_id"],
                name="workflow_step_runs_workflow_run_id_step_id_key",
            ),
        ]
        indexes = [
            # a run's steps in order (runner, run detail)
            models.Index(
                fields=["workflow_run", "sequence"],
                name="idx_workflow_step_runs_run_sequence",
            ),
            # running steps per account: the per-profile load count inside admission
            models.Index(fields=["status"], name="idx_workflow_step_runs_status"),
        ]

    def __str__(self) -> str:
        return f"{self.step_id} [{self.status}]"


class WorkflowEvent(models.Model):
    id = id_field()
    workflow_run = models.ForeignKey(
        WorkflowRun, on_delete=models.CASCADE, db_index=False, related_name="events"
    )
    sequence = models.IntegerField()
    event_type = models.CharField(max_length=100)
    step_id = models.CharField(max_length=200, null=True, blank=True)
    payload_json = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "workflow_events"
        constraints = [
            # per-run sequence, MAX+1 under the write lock; also the run's event index
            models.UniqueConstraint(
                fields=["workflow_run", "sequence"],
                name="workflow_events_workflow_run_id_sequence_key",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.sequence} {self.event_type}"


class WorkflowStepAttempt(models.Model):
    """loopsweb (0015): one attempt of a step on one account. A step that moved to another
    account after a rate limit, or was retried, has one row per try; the step run keeps the
    last. Opened when the step starts (status running), closed when it ends (finished,
    failed, timed out, rate limited, cancelled or recovered)."""

    id = id_field()
    step_run = models.ForeignKey(
        WorkflowStepRun,
        on_delete=models.CASCADE,
        db_index=False,
        related_name="attempts",
    )
    workflow_run = models.ForeignKey(
        WorkflowRun, on_delete=models.CASCADE, db_index=False, related_name="attempts"
    )
    step_id = models.CharField(max_length=200)
    account_profile = models.CharField(max_length=200, null=True, blank=True)
    account_tool = models.CharField(max_length=100, null=True, blank=True)
    # running, then a step status (succeeded, failed, timed_out, cancelled) or rate_limited
    status = models.CharField(max_length=20)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.BigIntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    error = models.TextField(null=True, blank=True)
    usage_input_tokens = models.BigIntegerField(null=True, blank=True)
    usage_output_tokens = models.BigIntegerField(null=True, blank=True)
    usage_cached_tokens = models.BigIntegerField(null=True, blank=True)
    usage_cost_usd = models.FloatField(null=True, blank=True)

    class Meta:
        db_table = "workflow_step_attempts"
        indexes = [
            # a step's attempts in order (item page, API, routes show)
            models.Index(
                fields=["step_run", "started_at"],
                name="idx_step_attempts_step",
            ),
            # a run's attempts (run page)
            models.Index(fields=["workflow_run"], name="idx_step_attempts_run"),
        ]

    def __str__(self) -> str:
        return f"{self.step_id} on {self.account_profile or '-'} [{self.status}]"
