"""The operator pages (`/ops/`): `urls`, `views`, `selectors` (live work per group and
project, deferrals, the inbox, drains; the reads shared with the API and /metrics are in
routing.selectors), `account_groups` (many accounts: their states, the accounts page's
filter and grouping), `account_actions` (Clear), `capacity_warnings`, `context` (the sandbox
line every page shows), `display` (bars, charts, text), `item` (an item's runs, step by
step), `run_work` (Deliver again, Discard, the whole patch), `worklists` (/ops/attention/,
/ops/delivered/) and `health` (`/healthz`, `/health/installation`, `manage.py health`). A
web surface."""
