"""The operator pages (`/ops/`): `urls`, `views`, `selectors` (live work, deferrals, inbox,
drains), `accounts` (account rows, shared with the API and /metrics) and `display` (bars,
charts, text), `health` (`GET /healthz`, `manage.py health`). A web surface."""
