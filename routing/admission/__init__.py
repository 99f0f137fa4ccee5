"""Admission: one event in, one decision out (docs/upstream.md §3), under the admission lock; one
path for one candidate or many, in two stages (the names docs/design.md uses):
stage 1, the plan, touches no store; stage 2, the admission transaction, reads, decides
and writes under the admission lock.

- `options`: route options and their validation;
- `plan`: stage 1, the plan (no store access; every value checked against its column);
- `decide`: stage 2's decision, before any write: `Hold`, `precheck`, the pool view,
  `FullCaps`;
- `rows`: stage 2's writes: the rows an admission writes and the created result;
- `transaction`: stage 2 for one plan (`admit`, `route_event`);
- `batch`: stage 2 for many plans in one transaction (`admit_batch`), same decisions;
- `retry`: an operator's retry re-admits the item with the route it stores;
- `results`: RouteResult and the work-item dict.

Layer: above `ledger`; imports `ledger.*`, `domain` and `routing.models`, never the drains
or the web surfaces.
"""

from routing.admission.batch import admit_batch, holds_without_lock
from routing.admission.decide import (
    FullCaps,
    Hold,
    PoolView,
    pool_assignment_now,
    precheck,
    scope_hold,
)
from routing.admission.options import (
    OPTION_NAMES,
    PIN_OPTIONS,
    RouteOptions,
    route_options,
)
from routing.admission.plan import (
    PlanReads,
    RoutePlan,
    check_plan_fits_columns,
    checked_route_options,
    normalize_project_path,
    plan_reads,
    plan_route,
    route_options_check,
    route_options_resolve,
)
from routing.admission.results import (
    CREATED,
    DEDUPED,
    SKIPPED,
    THROTTLED,
    RouteResult,
    work_item_to_dict,
)
from routing.admission.retry import (
    item_inbox_reopen,
    retry_outcome,
    retry_run,
    retry_work_item,
)
from routing.admission.transaction import (
    RouteRefused,
    admit,
    hand_over,
    projects_check_here,
    route_event,
)

__all__ = [
    "CREATED",
    "DEDUPED",
    "OPTION_NAMES",
    "PIN_OPTIONS",
    "SKIPPED",
    "THROTTLED",
    "FullCaps",
    "Hold",
    "PoolView",
    "RouteOptions",
    "PlanReads",
    "RoutePlan",
    "RouteRefused",
    "RouteResult",
    "admit",
    "admit_batch",
    "check_plan_fits_columns",
    "checked_route_options",
    "hand_over",
    "holds_without_lock",
    "normalize_project_path",
    "plan_reads",
    "plan_route",
    "pool_assignment_now",
    "precheck",
    "item_inbox_reopen",
    "retry_outcome",
    "retry_run",
    "retry_work_item",
    "projects_check_here",
    "route_event",
    "route_options",
    "route_options_check",
    "route_options_resolve",
    "scope_hold",
    "work_item_to_dict",
]
