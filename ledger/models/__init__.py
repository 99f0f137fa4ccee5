"""The route-admission ledger, with upstream (OpenLoops 0.4.12) table, column and index names.

Operators meet these names in SQL, in reports and in upstream documentation, so `db_table`,
`db_column` and index names follow upstream exactly (docs/upstream.md §1). Timestamps are proper
timestamp columns (upstream's sqlite stores ISO text; the meaning is the same).

Index names longer than Django's 30-character portability limit (an Oracle limit) are kept as
upstream spells them; models.E034 is silenced in settings for that reason.

One module per part of the record; every name is re-exported here (`from ledger.models
import X`), which is also what makes Django see every model of the app:

- `base`: the id field and the timestamps every table shares;
- `statuses`: statuses and choices (upstream values) and the status sets;
- `specs`: invocations and workflow specs;
- `loops`: loops and loop runs;
- `runs`: workflow runs, step runs, events;
- `work_items`: work items (the admission queue) and their deferrals;
- `accounts`: the account registry, cooldowns, the load kept per account;
- `workers`: run cluster workers;
- `hosts`: the machines that run agents (their roots, providers, heartbeat);
- `windows`: the rate-limit window observations per account;
- `revisions`: the rounds that continue an item's branch after its work was sent back;
- `notifications`: the episodes an operator is told about, and their delivery.
"""

from ledger.models.accounts import Account, AccountCooldown, AccountLoadCount
from ledger.models.base import TimestampedModel, id_field
from ledger.models.hosts import ClusterInstance, Host
from ledger.models.loops import Loop, LoopRun
from ledger.models.notifications import Notification, NotificationState
from ledger.models.revisions import RevisionState, RevisionTrigger, WorkItemRevision
from ledger.models.runs import (
    WorkflowEvent,
    WorkflowRun,
    WorkflowStepAttempt,
    WorkflowStepRun,
)
from ledger.models.specs import WorkflowInvocation, WorkflowSpec
from ledger.models.statuses import (
    ACTIVE_WORK_ITEM_STATUSES,
    KEEP_WORK_ITEM_STATUSES,
    TERMINAL_RUN_STATUSES,
    TERMINAL_WORK_ITEM_STATUSES,
    CatchUp,
    Intent,
    LoopRunStatus,
    LoopStatus,
    Overlap,
    RunStatus,
    SpecStatus,
    StepReasonCode,
    StepStatus,
    WorkItemStatus,
)
from ledger.models.windows import AccountWindow
from ledger.models.work_items import WorkflowWorkItem, WorkItemDeferral
from ledger.models.workers import RunWorker

__all__ = [
    "ACTIVE_WORK_ITEM_STATUSES",
    "KEEP_WORK_ITEM_STATUSES",
    "TERMINAL_RUN_STATUSES",
    "TERMINAL_WORK_ITEM_STATUSES",
    "Account",
    "AccountCooldown",
    "AccountLoadCount",
    "AccountWindow",
    "ClusterInstance",
    "CatchUp",
    "Host",
    "Intent",
    "Loop",
    "Notification",
    "NotificationState",
    "RevisionState",
    "RevisionTrigger",
    "WorkItemRevision",
    "LoopRun",
    "LoopRunStatus",
    "LoopStatus",
    "Overlap",
    "RunStatus",
    "RunWorker",
    "SpecStatus",
    "StepReasonCode",
    "StepStatus",
    "TimestampedModel",
    "WorkItemDeferral",
    "WorkItemStatus",
    "WorkflowEvent",
    "WorkflowInvocation",
    "WorkflowRun",
    "WorkflowSpec",
    "WorkflowStepAttempt",
    "WorkflowStepRun",
    "WorkflowWorkItem",
    "id_field",
]
