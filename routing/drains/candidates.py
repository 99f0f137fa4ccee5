"""Which candidates a drain takes, in which order: the post-filters (tags, project path
prefix) and the fair order (round-robin across projects, oldest first within one).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from routing.admission import (
    normalize_project_path,
)
from routing.drains.options import DrainOptions
from routing.drains.sources import (
    Candidate,
)

# --- fair ordering and filters ----------------------------------------------------------------


def fair_order(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Round-robin across projects (in order of each project's oldest candidate), oldest
    first within a project."""
    queues: OrderedDict[str, list[Candidate]] = OrderedDict()
    for candidate in candidates:
        queues.setdefault(candidate.project, []).append(candidate)
    ordered: list[Candidate] = []
    depth = 0
    while True:
        layer = [queue[depth] for queue in queues.values() if depth < len(queue)]
        if not layer:
            return ordered
        ordered.extend(layer)
        depth += 1


def _under(path: str, prefix: str) -> bool:
    path, prefix = path.rstrip("/") or "/", prefix.rstrip("/") or "/"
    return path == prefix or path.startswith(prefix if prefix == "/" else prefix + "/")


def passes_filters(candidate: Candidate, options: DrainOptions, cwd: str) -> bool:
    if options.tags and not set(options.tags) <= set(candidate.tags):
        return False
    if options.project_path_prefix:
        if not candidate.project:
            return False
        prefix = normalize_project_path(options.project_path_prefix, cwd=cwd)
        if not _under(normalize_project_path(candidate.project, cwd=cwd), prefix):
            return False
    return True
