"""Admission: one event in, one decision out (reference §3), under the admission lock.

- `options`: route options and their validation;
- `plan`: stage 1, the plan (no store access);
- `transaction`: stages 2 and 3, early dedupe and the admission transaction (`route_event`);
- `results`: RouteResult and the work-item dict.

Layer: above `ledger`; imports `ledger.*`, `routing.domain` and `routing.models`, never the
drains or the web surfaces.
"""

from routing.admission.options import (
    DEFAULT_MAX_PER_PROFILE,
    OPTION_NAMES,
    PIN_OPTIONS,
    RouteOptions,
    route_options,
)
from routing.admission.plan import (
    RoutePlan,
    check_plan_fits_columns,
    normalize_project_path,
    plan_route,
)
from routing.admission.results import (
    CREATED,
    DEDUPED,
    SKIPPED,
    THROTTLED,
    RouteResult,
    work_item_to_dict,
)
from routing.admission.transaction import PoolView, pool_assignment_now, route_event

__all__ = [
    "CREATED",
    "DEDUPED",
    "DEFAULT_MAX_PER_PROFILE",
    "OPTION_NAMES",
    "PIN_OPTIONS",
    "SKIPPED",
    "THROTTLED",
    "PoolView",
    "RouteOptions",
    "RoutePlan",
    "RouteResult",
    "check_plan_fits_columns",
    "normalize_project_path",
    "plan_route",
    "pool_assignment_now",
    "route_event",
    "route_options",
    "work_item_to_dict",
]
