"""The operator pages (`/ops/`): `urls`, `views`, `selectors` (live work per group and
project, deferrals, the inbox, drains; the reads shared with the API and /metrics are in
routing.selectors), `capacity` and `display` (bars, charts, text). A web surface."""
