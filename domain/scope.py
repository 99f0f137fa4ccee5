"""Route scope resolution for ``--max-active`` (docs/upstream.md §3.2.6).

Contract: the scope is the first non-blank of
1. the explicit ``--max-active-scope`` value (trimmed);
2. ``LOOPS_LOOP_NAME`` from the environment (trimmed) — the running loop's name, or the
   django-q2 schedule name a scheduled drain exports the same way;
3. the route key (``todos-task`` / ``generic-event``).
It is therefore always defined for real routes.
"""

from __future__ import annotations

from collections.abc import Mapping

LOOP_NAME_ENV = "LOOPS_LOOP_NAME"


def resolve_route_scope(
    *, explicit: str | None, env: Mapping[str, str], route_key: str
) -> str:
    for candidate in (explicit, env.get(LOOP_NAME_ENV)):
        if candidate is not None and candidate.strip():
            return candidate.strip()
    return route_key
