"""Ledger admins: the operator console over the record.

The record is history, so nothing is added, edited or deleted here (except the account
registry, `accounts`, which is configuration); the only writes are the
lifecycle actions (requeue, cancel, dead-letter, retry), each of which calls its service in
ledger.services after a confirmation page that shows how many rows it will touch.

Large tables (a million work items, millions of step runs) stay fast:
- no full-table COUNT: `show_full_result_count = False` and a paginator whose count stops at
  COUNT_CAP;
- newest first by primary key (ids start with their creation time, see ledger.ids), which is
  an index walk where `ORDER BY created_at` would sort the whole table;
- filters whose choices cost an index probe per value (a loose index scan), a fixed list, or
  a small live set, never `SELECT DISTINCT` over history; the age filter is a key range;
- `list_select_related` for every relation shown, raw id widgets for every relation.


Modules: `base` (the shared admin, links), `filters`, `actions` (lifecycle actions),
`work_items`, `accounts` (the runs' admin, which shows their commits and patch, is runs.admin); the cells, the paginator and the audit trail they share
with /ops/ are in ledger.webkit. Layer: a web surface; imports `ledger.*`, `domain`
and lower layers, never `routing.api`/`routing.ops` pages.
"""

from ledger.admin import accounts, work_items  # noqa: F401  (registers the admins)
