"""The operator pages (`/ops/`): `urls`, `views`, `selectors` (live work, deferrals, inbox,
drains), `accounts` (account rows, shared with the API and /metrics) and `display` (bars,
charts, text). A web surface."""
