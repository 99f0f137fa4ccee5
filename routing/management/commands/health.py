"""`manage.py health [--json]`: the installation's health, what `GET /health/installation`
answers (the database and both clusters), for a terminal, cron or a monitor. Exits 0 when
healthy, 1 when not (routing.ops.health.selectors). A load balancer asks `/healthz`
instead: this web process and its database only.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from ledger.management.terminal import OperatorCommand
from routing.ops.health.selectors import health_report


class Command(OperatorCommand):
    help = (
        "Report whether the database answers and both clusters report; exit 1 if not."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--json",
            action="store_true",
            help="print the /health/installation JSON body",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        report = health_report()
        body = report.as_json()
        if options["json"]:
            self.stdout.write(json.dumps(body, indent=2, sort_keys=True))
        else:
            self.stdout.write(f"status: {body['status']}")
            self.stdout.write(f"database: {body['database']}")
            for name, cluster in body["clusters"].items():
                ago = cluster["last_seen_seconds_ago"]
                seen = "never" if ago is None else f"{ago} s ago"
                workers = (
                    f", {cluster['workers']} live workers"
                    if "workers" in cluster
                    else ""
                )
                self.stdout.write(
                    f"cluster {name}: {cluster['status']} (last report {seen}, "
                    f"interval {cluster['interval_seconds']} s{workers})"
                )
            # The report first, whole lines, then the problems: stdout is flushed before
            # stderr is written, so a log or terminal that gets both keeps them in order
            # (stdout is block-buffered when it is not a terminal).
            self.stdout.flush()
            for problem in body.get("problems", []):
                self.stderr.write(f"problem: {problem}")
        if not report.healthy:
            raise CommandError("unhealthy (see above)")
