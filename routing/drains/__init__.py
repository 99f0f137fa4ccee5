"""Drains: take open work from a source and route it through admission (docs/upstream.md §5).

- `inbox`: ingest of envelopes into the inbox (idempotent on source and id);
- `sources`: where candidates come from (the inbox, an external command);
- `candidates`: post-filters and the fair order;
- `run`: `drain_run`, the drain itself (overlap skip, pre-checks, holds, routing);
- `candidate_results`: the result of a candidate held or failed, the rows held unread;
- `inbox_batch`: a drain's batch of inbox rows, admitted in one transaction;
- `outcomes`: what a drain writes on an inbox row;
- `outage`: a lost database connection stops the drain; its record is stored when it is back;
- `report`: the report, the drain record, the evidence file; `record_keeper`: the record as
  the drain goes, so a drain killed part-way leaves what it had admitted;
- `routable`: envelopes that can never route (the API's and ingest's warnings);
- `retention`: drain records that did nothing, pruned after their days;
- `options`: drain options; `configs`: the caps drain schedules and records configure;
- `schedules`: the periodic tasks every installation has.

Layer: above admission; imports `ledger.*`, `domain`, `routing.models` and
`routing.admission` (the package, never one of its submodules), never the web surfaces. The django-q2 entry points are in
`routing.tasks` (their dotted paths are stored in schedules, so they never move).
"""

from routing.drains.options import DRAIN_OPTION_NAMES, DrainOptions, drain_options
from routing.drains.outcomes import inbox_record_hold, inbox_record_route
from routing.drains.report import DrainReport, compact_result
from routing.drains.run import drain_run

__all__ = [
    "DRAIN_OPTION_NAMES",
    "DrainOptions",
    "DrainReport",
    "compact_result",
    "drain_options",
    "drain_run",
    "inbox_record_hold",
    "inbox_record_route",
]
