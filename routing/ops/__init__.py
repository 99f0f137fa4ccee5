"""The operator pages (`/ops/`): `urls`, `views`, `selectors` (live work per group and
project, deferrals, the inbox, drains; the reads shared with the API and /metrics are in
routing.selectors), `capacity`, `display` (bars, charts, text) and `health` (`/healthz`,
`/health/installation`, `manage.py health`). A web surface."""
