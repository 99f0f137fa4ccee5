"""The registered hosts (ledger.hosts), and forgetting one that is gone for good.

    python manage.py hosts [--json]          # name, live or dead, last seen, roots, providers
    python manage.py hosts --forget NAME     # a dead host taken out of the registry

A host stays registered after it stops (its roots keep admitting work, which waits for it and
fails after LOOPSWEB_NO_HOST_GRACE_SECONDS); `--forget` removes a decommissioned one. A live
host (seen within LOOPSWEB_HOST_DEAD_SECONDS) is refused: it would register again at its
next heartbeat. Forgetting empties its queue into the live hosts first and ends the runs
that were on it (ledger.services.hostloss).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError
from django.db import transaction
from django.utils import timezone

from ledger.hosts import dead_after, hosts_read_forget
from ledger.management.terminal import OperatorCommand
from ledger.models import Host
from ledger.queue import hosts_release_dead
from ledger.services import runs_end_on_host


class Command(OperatorCommand):
    help = "List the hosts that run agents, or forget a dead one (--forget NAME)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--forget", metavar="NAME", help="remove a dead host")
        parser.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        now = timezone.now()
        name = options["forget"]
        if name is not None:
            host = Host.objects.filter(name=name).first()
            if host is None:
                raise CommandError(f"no host named {name!r} is registered")
            if host.seen_at >= now - dead_after():
                raise CommandError(
                    f"host {name} is live (seen {int((now - host.seen_at).total_seconds())} s "
                    "ago): stop its run cluster first"
                )
            hosts_release_dead(now)  # its queue to the live hosts, if not done yet
            # ... and its runs end (their worktrees stay with it), if not done yet.
            ended = runs_end_on_host(name, now=now)
            with transaction.atomic():
                Host.objects.filter(pk=host.pk, seen_at__lt=now - dead_after()).delete()
            hosts_read_forget()
            lost = f" ({len(ended)} runs on it ended)" if ended else ""
            self.stdout.write(f"forgot host {name}{lost}")
            return
        rows = [
            {
                "name": h.name,
                "live": h.seen_at >= now - dead_after(),
                "seenAt": h.seen_at.isoformat(),
                "roots": h.roots,
                "providers": h.providers,
                "workers": h.workers,
                "queue": h.queue,
                "machineId": h.machine_id,
                "bootId": h.boot_id,
                "instance": h.instance,
            }
            for h in Host.objects.order_by("name")
        ]
        if options["json"]:
            self.stdout.write(json.dumps({"hosts": rows}, indent=2))
            return
        for row in rows:
            state = "live" if row["live"] else "dead"
            self.stdout.write(
                f"  {row['name']} [{state}] seen {row['seenAt']} roots "
                f"{', '.join(row['roots']) or '-'} providers "
                f"{', '.join(row['providers']) or '-'}"
            )
        self.stdout.write(f"{len(rows)} host(s)")
