"""The route-admission ledger, with upstream (OpenLoops 0.4.12) table, column and index names.

Operators meet these names in SQL, in reports and in upstream documentation, so `db_table`,
`db_column` and index names follow upstream exactly (reference §1). Timestamps are proper
timestamp columns (upstream's sqlite stores ISO text; the meaning is the same).

Index names longer than Django's 30-character portability limit (an Oracle limit) are kept as
upstream spells them; models.E034 is silenced in settings for that reason.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from ledger.ids import new_id


def id_field() -> models.CharField:
    return models.CharField(
        primary_key=True, max_length=32, default=new_id, editable=False
    )


class TimestampedModel(models.Model):
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


# --- statuses (upstream values) ---------------------------------------------------------------


class WorkItemStatus(models.TextChoices):
    QUEUED = "queued"
    DEFERRED = "deferred"
    ADMITTED = "admitted"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEAD_LETTER = "dead_letter"
    CANCELLED = "cancelled"


# Active work occupies a cap slot (reference §1.2).
ACTIVE_WORK_ITEM_STATUSES = (WorkItemStatus.ADMITTED, WorkItemStatus.RUNNING)
# Statuses an upsert never changes and an early dedupe stops on (reference §2.4, §3.2.9).
KEEP_WORK_ITEM_STATUSES = (
    WorkItemStatus.SUCCEEDED,
    WorkItemStatus.ADMITTED,
    WorkItemStatus.RUNNING,
    WorkItemStatus.FAILED,
    WorkItemStatus.DEAD_LETTER,
    WorkItemStatus.CANCELLED,
)
TERMINAL_WORK_ITEM_STATUSES = (
    WorkItemStatus.SUCCEEDED,
    WorkItemStatus.FAILED,
    WorkItemStatus.DEAD_LETTER,
    WorkItemStatus.CANCELLED,
)


class RunStatus(models.TextChoices):
    # `queued` is ours: admitted, not yet claimed by the runner. Upstream creates runs `running`.
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


TERMINAL_RUN_STATUSES = (
    RunStatus.SUCCEEDED,
    RunStatus.FAILED,
    RunStatus.TIMED_OUT,
    RunStatus.CANCELLED,
)


class StepStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


class SpecStatus(models.TextChoices):
    ACTIVE = "active"
    ARCHIVED = "archived"


class LoopStatus(models.TextChoices):
    ACTIVE = "active"
    PAUSED = "paused"
    STOPPED = "stopped"
    EXPIRED = "expired"


class LoopRunStatus(models.TextChoices):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    ABANDONED = "abandoned"
    SKIPPED = "skipped"


class Intent(models.TextChoices):
    ROUTE = "route"
    MUTATE = "mutate"
    REVIEW = "review"
    EVALUATE = "evaluate"
    REPORT = "report"


class CatchUp(models.TextChoices):
    NONE = "none"
    LATEST = "latest"
    ALL = "all"


class Overlap(models.TextChoices):
    SKIP = "skip"
    ALLOW = "allow"


# --- tables -----------------------------------------------------------------------------------


class WorkflowInvocation(TimestampedModel):
    """One row per routed source event (per dedupe key)."""

    id = id_field()
    workflow_id = models.CharField(max_length=32, null=True, blank=True)
    template_id = models.CharField(max_length=200, null=True, blank=True)
    source_kind = models.CharField(max_length=50)
    source_id = models.CharField(max_length=500, null=True, blank=True)
    source_dedupe_key = models.CharField(max_length=500, null=True, blank=True)
    source_json = models.JSONField()
    subject_kind = models.CharField(max_length=50)
    subject_id = models.CharField(max_length=500, null=True, blank=True)
    subject_path = models.TextField(null=True, blank=True)
    subject_url = models.TextField(null=True, blank=True)
    subject_json = models.JSONField()
    intent = models.CharField(max_length=20, choices=Intent.choices)
    scope_json = models.JSONField(null=True, blank=True)
    output_policy_json = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "workflow_invocations"
        indexes = [
            # "which invocation came from event X": admin search, drain reports
            models.Index(
                fields=["source_kind", "source_id"],
                name="idx_workflow_invocations_source",
            ),
            # invocations about one task/subject (ops pages, `routes invocations`)
            models.Index(
                fields=["subject_kind", "subject_id", "subject_path"],
                name="idx_workflow_invocations_subject",
            ),
        ]
        constraints = [
            # create-or-get by (source kind, idempotency key) at the start of every admission
            models.UniqueConstraint(
                fields=["source_kind", "source_dedupe_key"],
                condition=Q(source_dedupe_key__isnull=False),
                name="idx_workflow_invocations_dedupe",
            ),
        ]

    def __str__(self) -> str:
        return (
            f"{self.source_kind}:{self.source_dedupe_key or self.source_id or self.id}"
        )


class WorkflowSpec(TimestampedModel):
    """A workflow definition (upstream calls the table `workflow_specs`; there is no `workflows`)."""

    id = id_field()
    name = models.CharField(max_length=500)
    description = models.TextField(null=True, blank=True)
    version = models.IntegerField(default=1)
    status = models.CharField(
        max_length=20, choices=SpecStatus.choices, default=SpecStatus.ACTIVE
    )
    goal_json = models.JSONField(null=True, blank=True)
    steps_json = models.JSONField()

    class Meta:
        db_table = "workflow_specs"
        indexes = [
            # find the active spec by generated name before reusing it (admission step 9)
            models.Index(fields=["status", "name"], name="idx_workflows_status_name"),
        ]
        constraints = [
            # at most one active spec per name
            models.UniqueConstraint(
                fields=["name"],
                condition=Q(status="active"),
                name="idx_workflows_name_active",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Loop(TimestampedModel):
    id = id_field()
    name = models.CharField(max_length=500)
    description = models.TextField(null=True, blank=True)
    status = models.CharField(
        max_length=20, choices=LoopStatus.choices, default=LoopStatus.ACTIVE
    )
    archived_at = models.DateTimeField(null=True, blank=True)
    archived_from_status = models.CharField(max_length=20, null=True, blank=True)
    schedule_json = models.JSONField()
    target_json = models.JSONField()
    goal_json = models.JSONField(null=True, blank=True)
    machine_json = models.JSONField(null=True, blank=True)
    next_run_at = models.DateTimeField(null=True, blank=True)
    retry_scheduled_for = models.DateTimeField(null=True, blank=True)
    catch_up = models.CharField(
        max_length=10, choices=CatchUp.choices, default=CatchUp.LATEST
    )
    catch_up_limit = models.IntegerField(default=50)
    overlap = models.CharField(
        max_length=10, choices=Overlap.choices, default=Overlap.SKIP
    )
    max_attempts = models.IntegerField(default=1)
    retry_delay_ms = models.IntegerField(default=60_000)
    lease_ms = models.IntegerField(default=1_800_000)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "loops"
        indexes = [
            # the scheduler's "due loops" scan
            models.Index(
                fields=["status", "next_run_at"], name="idx_loops_status_next"
            ),
            # look-up by name (loop names are not unique)
            models.Index(fields=["name"], name="idx_loops_name"),
        ]

    def __str__(self) -> str:
        return self.name


class LoopRun(TimestampedModel):
    id = id_field()
    loop = models.ForeignKey(
        Loop, on_delete=models.CASCADE, db_index=False, related_name="runs"
    )
    loop_name = models.CharField(max_length=500, null=True, blank=True)
    scheduled_for = models.DateTimeField()
    attempt = models.IntegerField(default=1)
    status = models.CharField(max_length=20, choices=LoopRunStatus.choices)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    claimed_by = models.CharField(max_length=200, null=True, blank=True)
    claim_token = models.CharField(max_length=64, null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    pgid = models.IntegerField(null=True, blank=True)
    process_started_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    duration_ms = models.BigIntegerField(null=True, blank=True)
    stdout = models.TextField(null=True, blank=True)
    stderr = models.TextField(null=True, blank=True)
    error = models.TextField(null=True, blank=True)
    goal_run_id = models.CharField(max_length=32, null=True, blank=True)

    class Meta:
        db_table = "loop_runs"
        constraints = [
            models.UniqueConstraint(
                fields=["loop", "scheduled_for"],
                name="loop_runs_loop_id_scheduled_for_key",
            ),
        ]
        indexes = [
            # a loop's run history, newest last
            models.Index(fields=["loop", "created_at"], name="idx_runs_loop"),
            # runs by status (running runs for the ops pages)
            models.Index(fields=["status"], name="idx_runs_status"),
            # lease recovery: running runs whose lease expired
            models.Index(
                fields=["status", "lease_expires_at"], name="idx_runs_status_lease"
            ),
            # due-run scans by schedule time
            models.Index(fields=["scheduled_for"], name="idx_runs_scheduled"),
            # claim look-up by token (only claimed rows carry one)
            models.Index(
                fields=["claim_token"],
                condition=Q(claim_token__isnull=False),
                name="idx_runs_claim_token",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.loop_name or self.loop_id} @ {self.scheduled_for:%Y-%m-%dT%H:%M:%SZ}"


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
    # loopsweb (0005): the run's own git worktree (ledger.worktrees), recorded before it is
    # made so a crash never leaves one nobody knows of; removed_at once it is gone.
    worktree_path = models.TextField(null=True, blank=True)
    worktree_branch = models.CharField(max_length=255, null=True, blank=True)
    worktree_removed_at = models.DateTimeField(null=True, blank=True)

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


class WorkflowWorkItem(TimestampedModel):
    """The admission queue: one row per (route_key, idempotency_key)."""

    id = id_field()
    route_key = models.CharField(max_length=100)
    idempotency_key = models.CharField(max_length=500)
    invocation = models.ForeignKey(
        WorkflowInvocation,
        on_delete=models.CASCADE,
        db_index=False,
        related_name="work_items",
    )
    source_type = models.CharField(max_length=200)
    source_ref = models.CharField(max_length=500)
    subject_ref = models.CharField(max_length=500)
    project_key = models.TextField(null=True, blank=True)
    project_group = models.CharField(max_length=200, null=True, blank=True)
    # Added by 0002 (upstream 0008): the identity that scopes --max-active. NULL on rows written
    # before it existed; those never count toward a scoped total.
    route_scope = models.CharField(max_length=200, null=True, blank=True)
    priority = models.IntegerField(default=0)
    status = models.CharField(
        max_length=20, choices=WorkItemStatus.choices, default=WorkItemStatus.QUEUED
    )
    attempts = models.IntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    workflow = models.ForeignKey(
        WorkflowSpec,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        db_index=False,
        related_name="work_items",
    )
    loop = models.ForeignKey(
        Loop,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        db_index=False,
        related_name="work_items",
    )
    workflow_run = models.ForeignKey(
        WorkflowRun,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        db_index=False,
        related_name="+",
    )
    last_reason = models.TextField(null=True, blank=True)
    # loopsweb (0003): the stable code of the last deferral (route_cap, project_cap, group_cap,
    # profile_cap, cooldown), kept beside upstream's human last_reason.
    reason_code = models.CharField(max_length=40, null=True, blank=True)

    class Meta:
        db_table = "workflow_work_items"
        constraints = [
            # dedupe: one item per (route, idempotency key); the upsert's conflict target
            models.UniqueConstraint(
                fields=["route_key", "idempotency_key"],
                name="workflow_work_items_route_key_idempotency_key_key",
            ),
        ]
        indexes = [
            # `routes list --status`: ordered priority DESC, created_at ASC within a status
            models.Index(
                fields=["status", "next_attempt_at", "-priority", "created_at"],
                name="idx_workflow_work_items_status_next",
            ),
            # the per-project cap count: active items of one project, across routes
            models.Index(
                fields=["project_key", "status"], name="idx_workflow_work_items_project"
            ),
            # the per-group cap count: active items of one project group, across routes
            models.Index(
                fields=["project_group", "status"], name="idx_workflow_work_items_group"
            ),
            # items of one invocation (refresh, cascades)
            models.Index(
                fields=["invocation"], name="idx_workflow_work_items_invocation"
            ),
            # the --max-active count: active items of one route scope. Created only by
            # migration 0002, never in 0001 (older databases lack the column at 0001).
            models.Index(
                fields=["route_scope", "status"], name="idx_workflow_work_items_scope"
            ),
            # the child side of the workflow_run foreign key (0008): SQLite looks up the
            # items naming a run when a run is inserted after its item (a batched
            # admission) and when a run is deleted; without it each lookup reads every item
            models.Index(fields=["workflow_run"], name="idx_workflow_work_items_run"),
        ]

    def __str__(self) -> str:
        # the idempotency key already starts with the route key (`todos-task:T-1`)
        return f"{self.idempotency_key} [{self.status}]"


class WorkItemDeferral(models.Model):
    """loopsweb (0003): one row per deferral, with what the decision saw.

    Answers "why did this item wait yesterday?": the reason code, upstream's human reason, and
    the counts and limits (and account loads, for pool deferrals) read inside the deciding
    transaction.
    """

    id = id_field()
    work_item = models.ForeignKey(
        WorkflowWorkItem,
        on_delete=models.CASCADE,
        db_index=False,
        related_name="deferrals",
    )
    reason_code = models.CharField(max_length=40)
    reason = models.TextField()
    route_scope = models.CharField(max_length=200, null=True, blank=True)
    project_key = models.TextField(null=True, blank=True)
    project_group = models.CharField(max_length=200, null=True, blank=True)
    counts_json = models.JSONField(default=dict)
    limits_json = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "workflow_work_item_deferrals"
        indexes = [
            # one item's deferral history, oldest first (item page, API detail)
            models.Index(
                fields=["work_item", "created_at"], name="idx_wi_deferrals_item"
            ),
            # deferrals by reason over time (ops overview, metrics)
            models.Index(
                fields=["reason_code", "created_at"], name="idx_wi_deferrals_reason"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.reason_code}: {self.reason}"


class AccountCooldown(TimestampedModel):
    """loopsweb (0003): an account that reported a provider rate limit, cooling until `until`.

    One row per account profile; a new report keeps the later of the two deadlines.
    """

    account_profile = models.CharField(max_length=200, primary_key=True)
    account_tool = models.CharField(max_length=100, null=True, blank=True)
    until = models.DateTimeField()
    reason = models.TextField(null=True, blank=True)
    reports = models.IntegerField(default=1)
    step_run = models.ForeignKey(
        WorkflowStepRun,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        db_index=False,
        db_constraint=False,
        related_name="+",
    )

    class Meta:
        db_table = "account_cooldowns"
        indexes = [
            # cooling accounts now: pool assignment and the step-start re-check
            models.Index(fields=["until"], name="idx_account_cooldowns_until"),
        ]

    def __str__(self) -> str:
        return f"{self.account_profile} until {self.until:%Y-%m-%dT%H:%M:%SZ}"


class AccountLoadCount(models.Model):
    """loopsweb (0004): the load of one account, kept in the transactions that change it.

    `running` = its step runs in `running`; `reserved` = admitted runs (queued, or running
    with no step started yet) whose first account-carrying step is on it (see
    `ledger.selectors.account_state`). Every service that moves a run or step run applies
    the change here in the same transaction (`ledger.loads`), so admission reads the pool's
    load in one row per account, however many runs are queued. `recount_account_loads`
    recomputes both from the rows and repairs any drift.
    """

    account_profile = models.CharField(max_length=200, primary_key=True)
    running = models.IntegerField(default=0)
    reserved = models.IntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "workflow_account_loads"

    def __str__(self) -> str:
        return (
            f"{self.account_profile}: {self.running} running, {self.reserved} reserved"
        )


class RunWorker(TimestampedModel):
    """loopsweb (0006): a worker process of a run cluster, as it last reported itself.

    Each worker of a run cluster writes its row every few seconds (ledger.capacity); a row not
    seen for a while is a worker that is gone. Busy workers are read from the runs they hold
    (`workflow_runs.claimed_by` = `<host>:<pid>`), so this table only says what exists.
    """

    cluster = models.CharField(max_length=100)
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    # The worker's qcluster (its sentinel's pid): two clusters on one host stay apart.
    cluster_pid = models.IntegerField()
    seen_at = models.DateTimeField()

    class Meta:
        db_table = "loopsweb_run_workers"
        constraints = [
            # a worker upserts its own row; a pid reused on the host takes the old row over
            models.UniqueConstraint(
                fields=["host", "pid"], name="uniq_run_workers_host_pid"
            ),
        ]
        indexes = [
            # live workers (ops capacity) and pruning of the gone
            models.Index(fields=["seen_at"], name="idx_run_workers_seen"),
        ]

    def __str__(self) -> str:
        return f"{self.cluster} worker {self.host}:{self.pid}"


class Account(TimestampedModel):
    """loopsweb (0004): a registered agent account: which provider, whether it may be
    assigned, an optional running cap, and the environment that selects its login.

    The environment says WHERE the provider CLI keeps this account's login (for example
    `CODEX_HOME=/srv/agents/acctA/codex`), never a secret: keys that look like secrets are
    refused by `account_add`. The name is the `account_profile` step runs record.
    """

    name = models.CharField(max_length=200, primary_key=True)
    provider = models.CharField(max_length=20)
    enabled = models.BooleanField(default=True)
    # Tightens the route's --max-per-profile for this account (None: the route's cap only).
    max_running = models.PositiveIntegerField(null=True, blank=True)
    env_json = models.JSONField(default=dict, blank=True)
    # 0009: the path of a 0600 file of NAME=value lines (an API-key login), read when a
    # step starts (ledger.envfile); the value never reaches the database.
    env_file = models.CharField(max_length=1000, null=True, blank=True)
    notes = models.TextField(blank=True, default="")

    class Meta:
        db_table = "accounts"

    def __str__(self) -> str:
        state = "" if self.enabled else " (disabled)"
        return f"{self.name} [{self.provider}]{state}"
