"""The web toolkit both web surfaces use, the admin (ledger.admin) and /ops/ (routing.ops,
routing.templatetags): `cells` (compact HTML cells: short ids, status badges, ages, task
titles, where an item stands), `paging` (a paginator whose count stops at a cap), `audit`
(an operator action's admin LogEntry), `access` (who sees what: the view permissions).

Layer: below the web surfaces; imports `ledger.*` reads, `domain` and Django, never a surface.
"""
