"""The operator pages (`/ops/`): `urls`, `views`, `selectors` (live work per group and
project, deferrals, the inbox, drains; the reads shared with the API and /metrics are in
routing.selectors), `account_groups` (many accounts: their states, the accounts page's
filter and grouping), `capacity`, `display` (bars, charts, text) and `health` (`/healthz`,
`/health/installation`, `manage.py health`). A web surface."""
