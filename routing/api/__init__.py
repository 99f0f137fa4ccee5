"""The JSON API (`/api/v1/`): `urls`, `views`, `forms` (query and route parameters),
`serializers`, `selectors` (the list and detail reads), `auth` (bearer tokens or a staff
session), `tokens` (create, revoke; only the SHA-256 is stored) and `middleware` (JSON for
every status, 500 and 503 included). A web surface."""
