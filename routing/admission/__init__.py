"""Admission: one event in, one decision out (reference §3), under the admission lock.

- `options`: route options and their validation;
- `plan`: stage 1, the plan (no store access);
- `transaction`: stage 2, the admission transaction in one pass (`admit`, `route_event`);
- `results`: RouteResult and the work-item dict.

Layer: above `ledger`; imports `ledger.*`, `domain` and `routing.models`, never the
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
from routing.admission.transaction import (
    Held,
    PoolView,
    admit,
    hand_over,
    pool_assignment_now,
    route_event,
)

__all__ = [
    "CREATED",
    "DEDUPED",
    "DEFAULT_MAX_PER_PROFILE",
    "OPTION_NAMES",
    "PIN_OPTIONS",
    "SKIPPED",
    "THROTTLED",
    "Held",
    "PoolView",
    "RouteOptions",
    "RoutePlan",
    "RouteResult",
    "admit",
    "check_plan_fits_columns",
    "hand_over",
    "normalize_project_path",
    "plan_route",
    "pool_assignment_now",
    "route_event",
    "route_options",
    "work_item_to_dict",
]
