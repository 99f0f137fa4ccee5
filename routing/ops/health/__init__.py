"""Health: of this web process and its database (`/healthz`, `/readyz`, `/livez`) and of the
installation, the database and both clusters (`/health/installation`, `manage.py health`).
See selectors and views."""
