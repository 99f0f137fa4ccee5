"""The JSON API (`/api/v1/`): `urls`, `views`, `forms` (query and route parameters),
`serializers`, `selectors` (the list and detail reads), `auth` (bearer tokens or a staff
session) and `tokens` (create, revoke; only the SHA-256 is stored). A web surface."""
