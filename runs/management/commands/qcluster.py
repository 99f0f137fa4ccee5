"""django-q2's `qcluster`, through runs.cluster_start when it starts a run cluster.

`runs` comes before `django_q` in INSTALLED_APPS, so `manage.py qcluster` is this command;
everything but the start is django-q2's. A command of its own rather than a patch of
django-q2's made in RunsConfig.ready(): every process runs ready(), and importing
django-q2's cluster there was about 20 ms of the start of every command (a `drain`: 290 ms
of CPU before, 268 ms after; measured).
"""

from __future__ import annotations

from typing import Any

from django_q.management.commands import qcluster


class Command(qcluster.Command):
    def handle(self, *args: Any, **options: Any) -> Any:
        from runs.cluster_start import cluster_start, is_run_cluster

        if is_run_cluster(options):
            cluster_start()
        return super().handle(*args, **options)
