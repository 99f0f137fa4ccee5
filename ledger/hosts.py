"""Hosts: the machines that run agents, and which of them can serve a run.

- Registration: every worker of a run cluster writes its host's row (`Host`) with its
  heartbeat (runs.heartbeat, every 10 s): the stable name (LOOPSWEB_HOST_NAME), the real
  paths of LOOPSWEB_PROJECT_ROOTS, the providers whose binary it finds (resolved as
  runs.providers resolves them: LOOPSWEB_<PROVIDER>_BIN on PATH or absolute) and its
  worker count. A host seen within LOOPSWEB_HOST_DEAD_SECONDS is live.
- Serving: a host serves a run when the project of the run's agent steps (their `cwd`) lies
  inside one of its roots, the host has that project on its disk, and it has the steps'
  provider. A run without agent steps is served by every host.
- The checkout (`Host.projects`, path -> has it): each host checks its own disk and records
  what it found: on the machine where a route names a project (admission, before any
  lock), when it is handed a run (a miss refreshes the entry), and with its heartbeat for
  the paths other hosts know of and the paths runs wait for. Placement sends a run only to
  a host that has its project; while no host has checked it yet the run waits ("waiting for
  the hosts to check <path>", at most a heartbeat); when every live host that could serve it
  lacks it, or handed it back, it waits "no host has <path>" and fails after
  LOOPSWEB_NO_HOST_GRACE_SECONDS. A host that hands a run back is kept out
  (`hosts_declined`) until the run is claimed: a hand-back never loops.
- Placement (`run_placement`): among the live hosts that serve the run, the one whose queue
  holds the fewest tasks per worker (the ORM broker keeps a task's row until it ends, so
  the rows of a host's queue are its running and waiting runs). A run whose worktree is on
  a host (a parked run) goes back to that host only. With no host registered at all (one
  machine, its run cluster not started yet) there is nothing to choose: the shared queue.

Record layer (beside ledger.queue, which places every run through here): models, settings
and django-q2's broker table only.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, JSONField, Value
from django.db.models.functions import Coalesce
from django.utils import timezone
from django_q.models import OrmQ

from ledger.instances import boot_id, machine_id, process_instance
from ledger.models import Host, WorkflowRun

NO_HOST_SERVES = "no host serves {project} for {provider}"
NO_HOST_SERVES_PROJECT = "no host serves {project}"
NO_HOST_LIVE = "no live host (every registered run cluster is gone)"
WORKTREE_HOST_GONE = "its worktree is on host {host}, which is not live"
NOT_SERVED_HERE = "host {host} cannot serve {project}: {why}"
ADMISSION_NO_PROVIDER = (
    "no {which} host serves provider {provider} (hosts: {hosts}); start a run cluster "
    "where its CLI is found (LOOPSWEB_{env}_BIN), or route to a provider they have"
)
NO_HOST_HAS = "no host has {project}"
HOSTS_CHECKING = "waiting for the hosts to check {project}"
# A run's stored wait code (`host_wait_code`) when it waits on a project's presence: the
# hosts have not all checked it, or none has it.
WAIT_CHECKING = "checking"
WAIT_MISSING = "missing"
PROJECTS_KEPT = 500  # entries of a host's `projects` (the oldest go first)
ADMISSION_NO_HOST = (
    "no registered host serves {path} (their project roots: {roots}); "
    "add the project under a host's LOOPSWEB_PROJECT_ROOTS"
)


def host_name() -> str:
    return str(settings.LOOPSWEB_HOST_NAME)


def host_queue(name: str) -> str:
    """The django-q2 queue (ORM broker key) of a host's run cluster."""
    return f"{settings.LOOPSWEB_RUN_CLUSTER}@{name}"


def dead_after() -> timedelta:
    return timedelta(seconds=int(settings.LOOPSWEB_HOST_DEAD_SECONDS))


def local_roots() -> list[str]:
    """This machine's roots as configured and as real paths (a root that is a symlink on
    this machine is reached by either name from a machine that does not have it)."""
    configured = [os.path.normpath(root) for root in settings.LOOPSWEB_PROJECT_ROOTS]
    return sorted({*configured, *(os.path.realpath(root) for root in configured)})


def local_providers() -> list[str]:
    """Providers whose agent binary this machine finds (as runs.providers finds it)."""
    found = []
    for provider, configured in sorted(settings.LOOPSWEB_PROVIDER_BINARIES.items()):
        if shutil.which(configured or provider) is not None:
            found.append(provider)
    return found


def host_report(
    *, workers: int, now: datetime | None = None, providers: Sequence[str] | None = None
) -> None:
    """This host is alive (upsert by name): roots, providers, workers, seen now."""
    now = now or timezone.now()
    values = {
        "queue": host_queue(host_name()),
        "roots": local_roots(),
        "providers": list(local_providers() if providers is None else providers),
        "workers": workers,
        "seen_at": now,
        "released_at": None,
        "machine_id": machine_id(),
        "boot_id": boot_id(),
        "instance": process_instance(),
    }
    # A row an older loopsweb wrote (projects NULL): from now on this host says what it has.
    says = Coalesce("projects", Value({}, output_field=JSONField()))
    updated = Host.objects.filter(name=host_name()).update(
        updated_at=now, projects=says, **values
    )
    if not updated:
        Host.objects.get_or_create(
            name=host_name(), defaults={**values, "projects": {}}
        )


# Every registered host, read at most once per HOSTS_READ_SECONDS per process: admissions
# and placements (one per run) read this, and hosts change on a scale of heartbeats (10 s)
# and deaths (LOOPSWEB_HOST_DEAD_SECONDS), so a drain of 50 candidates reads it once.
HOSTS_READ_SECONDS = 2.0
_read: tuple[float, list[Host]] | None = None


def registered_hosts(*, fresh: bool = False) -> list[Host]:
    global _read
    clock = time.monotonic()
    if fresh or _read is None or clock - _read[0] > HOSTS_READ_SECONDS:
        _read = (clock, list(Host.objects.order_by("name")))
    return _read[1]


def hosts_read_forget() -> None:
    """Read the hosts again at the next call (tests; a host that just registered)."""
    global _read
    _read = None


def live_hosts(now: datetime | None = None, *, fresh: bool = False) -> list[Host]:
    now = now or timezone.now()
    return [h for h in registered_hosts(fresh=fresh) if h.seen_at >= now - dead_after()]


def served_roots() -> list[str] | None:
    """The project roots of every registered host (live or not), or None when no host is
    registered (admission then uses this machine's LOOPSWEB_PROJECT_ROOTS)."""
    hosts = registered_hosts()
    if not hosts:
        return None
    return sorted({root for h in hosts for root in h.roots or []})


@dataclass(frozen=True)
class RunTarget:
    """What a run needs from a host: its agent steps' project and provider (None: any)."""

    project: str | None
    provider: str | None
    worktree_host: str | None = None
    declined: tuple[
        str, ...
    ] = ()  # hosts that handed the run back since its last claim

    def wants(self) -> str:
        if self.project is None:
            return "no live host takes this run"
        if self.provider is None:
            return NO_HOST_SERVES_PROJECT.format(project=self.project)
        return NO_HOST_SERVES.format(project=self.project, provider=self.provider)


def target_of_steps(steps: Sequence[Mapping[str, Any]] | None) -> RunTarget:
    for step in steps or []:
        target = step.get("target") if isinstance(step, Mapping) else None
        if isinstance(target, Mapping) and target.get("type") == "agent":
            cwd = target.get("cwd")
            provider = target.get("provider")
            return RunTarget(
                # Admission resolved the path already: no file system here (placement runs
                # under the admission lock).
                project=os.path.normpath(cwd) if isinstance(cwd, str) and cwd else None,
                provider=provider if isinstance(provider, str) and provider else None,
            )
    return RunTarget(project=None, provider=None)


def run_target(run_id: str) -> RunTarget | None:
    """The run's target, or None when the run does not exist."""
    row = (
        WorkflowRun.objects.filter(pk=run_id)
        .values(
            "workflow__steps_json",
            "worktree_host",
            "worktree_removed_at",
            "hosts_declined",
        )
        .first()
    )
    if row is None:
        return None
    found = target_of_steps(row["workflow__steps_json"])
    worktree_host = None
    if row["worktree_host"] and row["worktree_removed_at"] is None:
        worktree_host = row["worktree_host"]
    declined = tuple(str(h) for h in row["hosts_declined"] or [])
    return RunTarget(found.project, found.provider, worktree_host, declined)


def inside(path: str, roots: Collection[str]) -> bool:
    return any(Path(path).is_relative_to(root) for root in roots)


def host_serves(host: Host, target: RunTarget) -> bool:
    if target.worktree_host is not None and host.name != target.worktree_host:
        return False
    if target.project is not None and not inside(target.project, host.roots or []):
        return False
    return target.provider is None or target.provider in (host.providers or [])


def serve_here(target: RunTarget) -> str | None:
    """Why this machine cannot serve the run (None: it can): roots, the project directory,
    the provider's binary, read from this machine itself, not from its Host row."""
    project = target.project
    if target.worktree_host is not None and target.worktree_host != host_name():
        return NOT_SERVED_HERE.format(
            host=host_name(),
            project=project,
            why=f"its worktree is on {target.worktree_host}",
        )
    if project is None:
        return None
    if not inside(project, local_roots()):
        why = "outside LOOPSWEB_PROJECT_ROOTS"
    elif not os.path.isdir(project):
        why = "the project directory does not exist here"
    elif target.provider is not None and target.provider not in local_providers():
        why = f"no {target.provider} binary"
    else:
        return None
    return NOT_SERVED_HERE.format(host=host_name(), project=project, why=why)


@dataclass(frozen=True)
class Placement:
    queue: str  # the broker key to put the task under
    host: str | None  # None: the shared queue (no host registered)
    wait_reason: str | None = None  # set: no live host serves it, no queue
    # WAIT_CHECKING or WAIT_MISSING, with the project, when the wait is on a project's presence
    wait_code: str | None = None
    wait_project: str | None = None


def run_placement(
    run_id: str,
    *,
    exclude: Collection[str] = (),
    now: datetime | None = None,
    steps: Sequence[Mapping[str, Any]] | None = None,
) -> Placement:
    """Where the run's task goes (module docstring: placement). `steps`: the run's workflow
    steps when the caller has them (a new run: no worktree yet), else read from the run."""
    shared = Placement(queue=settings.LOOPSWEB_RUN_CLUSTER, host=None)
    hosts = live_hosts(now)
    if not registered_hosts():
        return shared
    target = target_of_steps(steps) if steps is not None else run_target(run_id)
    if target is None:
        return shared  # no such run: the runner's claim makes the delivery a no-op
    able = [h for h in hosts if host_serves(h, target)]
    skip = {*exclude, *target.declined}
    serving = [h for h in able if h.name not in skip]
    if target.project is not None and target.worktree_host is None:
        # True: has it; False: lacks it; None: not checked yet; "roots": never says.
        has = {
            h.name: "roots" if h.projects is None else h.projects.get(target.project)
            for h in serving
        }
        sure = [h for h in serving if has[h.name] is True]
        trusted = [h for h in serving if has[h.name] == "roots"]
        if sure or trusted:
            serving = sure or trusted
        elif any(has[h.name] is None for h in serving):
            return Placement(
                "",
                None,
                HOSTS_CHECKING.format(project=target.project),
                WAIT_CHECKING,
                target.project,
            )
        elif able:
            return Placement(
                "",
                None,
                NO_HOST_HAS.format(project=target.project),
                WAIT_MISSING,
                target.project,
            )
    if not serving:
        if target.worktree_host is not None:
            return Placement(
                "", None, WORKTREE_HOST_GONE.format(host=target.worktree_host)
            )
        if not hosts:
            return Placement("", None, NO_HOST_LIVE)
        return Placement("", None, target.wants())
    if len(serving) == 1:
        chosen = serving[0]
    else:
        rows = dict(
            OrmQ.objects.filter(key__in=[h.queue for h in serving])
            .values("key")
            .annotate(n=Count("id"))
            .values_list("key", "n")
        )
        random.shuffle(serving)  # ties spread
        chosen = min(serving, key=lambda h: rows.get(h.queue, 0) / max(1, h.workers))
    return Placement(queue=chosen.queue, host=chosen.name)


def run_wait_record(
    run_id: str, placement: Placement | None, now: datetime | None = None
) -> None:
    """Record why no host takes a queued run (its placement's wait), and since when; or
    clear it (None)."""
    now = now or timezone.now()
    if placement is None:
        WorkflowRun.objects.filter(pk=run_id, host_wait_since__isnull=False).update(
            host_wait_reason=None,
            host_wait_since=None,
            host_wait_code=None,
            host_wait_project=None,
        )
        return
    WorkflowRun.objects.filter(pk=run_id, host_wait_since__isnull=True).update(
        host_wait_since=now
    )
    if not WorkflowRun.objects.filter(pk=run_id).update(
        host_wait_reason=placement.wait_reason,
        host_wait_code=placement.wait_code,
        host_wait_project=placement.wait_project,
    ):
        # A batched admission inserts its runs after handing them over: record it then.
        if transaction.get_connection().in_atomic_block:
            transaction.on_commit(lambda: run_wait_record(run_id, placement, now))


# --- which projects a host has -----------------------------------------------------------------


def project_here(project: str) -> bool | None:
    """Whether this machine has `project` (None: it lies outside this machine's roots)."""
    if not inside(project, local_roots()):
        return None
    return os.path.isdir(project)


def projects_record(found: Mapping[str, bool]) -> bool:
    """Record on this host's row what it found on its disk (path -> has it); whether any
    entry changed. Nothing when this machine is not a registered host."""
    mine = Host.objects.filter(name=host_name())
    known = mine.values_list("projects", flat=True).first()
    if known is None:
        return False
    known = dict(known or {})
    changed = {path: has for path, has in found.items() if known.get(path) is not has}
    if not changed:
        return False
    for path in changed:
        known.pop(path, None)  # a changed entry becomes the newest
    known.update(changed)
    kept = dict(list(known.items())[-PROJECTS_KEPT:])
    mine.update(projects=kept)
    hosts_read_forget()
    return True


def project_check_here(project: str, *, has: bool | None = None) -> None:
    """A route names `project` on this machine (or a run for it starts here, `has`): when
    this machine is a live host whose roots hold it and has not recorded that yet, it
    checks its disk now (outside any lock) and records what it found."""
    me = next((h for h in live_hosts() if h.name == host_name()), None)
    if me is None:
        return
    known = (me.projects or {}).get(project)
    if has is None:
        if known is not None:
            return
        has = project_here(project)
    if has is not None and known is not has:
        projects_record({project: has})


@dataclass(frozen=True)
class HostsSnapshot:
    """What admission's plan knows of the hosts, read once by its caller: the roots a
    project is admitted under (every registered host's), or None when no host is
    registered (this machine's LOOPSWEB_PROJECT_ROOTS decide, as with a single machine)."""

    roots: tuple[str, ...] | None


def hosts_snapshot() -> HostsSnapshot:
    roots = served_roots()
    return HostsSnapshot(None if roots is None else tuple(roots))


def admission_provider_refusal(
    provider: str, now: datetime | None = None
) -> str | None:
    """Why admission refuses a route of `provider` (None: it does not): hosts are
    registered and none of the live ones (none at all live: none of the registered ones)
    has the provider's CLI, so its runs would only wait ("no host serves ... for ...")."""
    hosts = registered_hosts()
    if not hosts:
        return None  # one machine, its run cluster not started yet: nothing to say
    live = live_hosts(now)
    candidates = live or hosts
    if any(provider in (h.providers or []) for h in candidates):
        return None
    return ADMISSION_NO_PROVIDER.format(
        which="live" if live else "registered",
        provider=provider,
        hosts=", ".join(
            f"{h.name} [{', '.join(h.providers or []) or 'no agent CLI'}]"
            for h in candidates
        ),
        env=provider.upper(),
    )
