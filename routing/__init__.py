"""The decisions, in layers (a module imports only from its own layer or below;
tests/test_layers.py enforces it):

- below it: `domain` (pure rules), `agents` (what the CLIs print), `ledger` (the record)
  and `runs` (execution on this host);
- `models.py`, `admission/`: the routing app's rows (inbox, drain records, API tokens) and the
  admission transaction, above `ledger`;
- `drains/`, `tasks.py`: drains, the inbox, sources, schedules, django-q2 entry points;
- `selectors.py`: the reads the web surfaces share (account rows, scope rows, deferred items
  by reason, inbox depth), so the API, /ops and /metrics agree;
- `api/`, `ops/`, `metrics/`, `templatetags/`: the web surfaces;
- `management/`: commands and their shared arguments.
"""
