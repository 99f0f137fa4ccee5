"""Notifications (docs/operations.md "Notifications"): one message per episode that needs a
human, recorded here and posted to LOOPSWEB_NOTIFY_URL by runs.notifications.

Contract:
1. **Once per episode.** `notify(kind, episode, text, payload)` records one row per
   `(kind, episode)` (the unique key of `loopsweb_notifications`) and, once the caller's
   transaction commits, queues its delivery on the main (drain) cluster's queue
   (`NOTIFY_TASK`); it returns whether the row is new. With LOOPSWEB_NOTIFY_URL unset it
   does nothing, reads nothing and returns False.
2. **Never in the way.** It never raises into its caller: a notification never blocks or
   fails a run. Its statements run in a savepoint of their own, so a database error rolls
   back only them and the caller's transaction goes on; it is one warning line with the
   error's first line (one per outage for an error that passes, ledger.dberrors). A lost
   queueing is made good by the sweep (`notifications-send`, every minute).
3. **The text** is bounded (TEXT_CHARS), its control characters escaped (domain.controls,
   lines kept) and made inert for chat: mentions (domain.forge_text) and the `<` `>` a
   Slack message reads as commands (`<!channel>`) no longer act.
4. **The hooks.** Each hook where loopsweb meets an episode is one call of this module
   (the kinds below); the episode key says what makes two meetings one episode.
   `notify_pool_exhausted` and the sweep's `notify_pools_available` keep the pairs of a
   pool's episode; `cluster_silent` is found by the sweep (`notify_instances_silent`).
   `needs_human` is called by the revision code (`notify` itself).

Layer: ledger services; reads the record only (no other service), so any service may call it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import (
    Case,
    Count,
    Exists,
    F,
    IntegerField,
    OuterRef,
    Sum,
    Value,
    When,
    Window,
)
from django.utils import timezone

from domain.controls import terminal_lines
from domain.forge_text import neutralize
from ledger.dberrors import error_passes, first_line
from ledger.hosts import dead_after
from ledger.models import (
    ClusterInstance,
    Notification,
    NotificationState,
    WorkflowWorkItem,
)
from ledger.queue import main_task
from ledger.selectors import account_registry, account_state

logger = logging.getLogger(__name__)
T = TypeVar("T")

# The django-q2 task that delivers one row (runs.tasks; stored in queued tasks).
NOTIFY_TASK = "runs.tasks.notifications_send"

RUN_FAILED = "run_failed"
LOGIN_FAILED = "login_failed"
POOL_EXHAUSTED = "pool_exhausted"
POOL_AVAILABLE = "pool_available"
HOST_GONE = "host_gone"
CLUSTER_SILENT = "cluster_silent"
NEEDS_HUMAN = "needs_human"
KINDS = (
    RUN_FAILED,
    LOGIN_FAILED,
    POOL_EXHAUSTED,
    POOL_AVAILABLE,
    HOST_GONE,
    CLUSTER_SILENT,
    NEEDS_HUMAN,
)

TEXT_CHARS = 2000
ERROR_CHARS = 500
TITLE_CHARS = 200
EPISODE_CHARS = 300  # the column's length
KIND_CHARS = 40
# A pool's members in its episode key, at most this long (longer: cut, with a hash).
POOL_KEY_CHARS = 200
# A run cluster instance silent for longer than this when the sweep first sees it is not
# told about (an installation that turns notifications on is not told its whole past).
SILENT_LOOKBACK = timedelta(days=1)
OPEN_EPISODES_READ = 100
INSTANCES_READ = 100


def notify_url() -> str:
    return str(getattr(settings, "LOOPSWEB_NOTIFY_URL", "") or "")


def message_text(text: str) -> str:
    """`text` as a message carries it (module docstring, "the text")."""
    text = neutralize(terminal_lines(text.replace("\r\n", "\n")))
    text = text.replace("<", "\u2039").replace(">", "\u203a")
    if len(text) > TEXT_CHARS:
        text = text[: TEXT_CHARS - 1] + "\u2026"
    return text


def _cut(value: str, limit: int) -> str:
    return value if len(value) <= limit else value[: limit - 1] + "\u2026"


# A passing database error (ledger.dberrors) is one line per outage: quiet until a write
# of this module goes through again.
_outage = False


def _failed(what: str, exc: DatabaseError) -> None:
    global _outage
    if not _outage:
        logger.warning(
            "notification %s not recorded: the database did not take it (%s)",
            what,
            first_line(exc),
        )
    _outage = error_passes(exc)


def notify(
    kind: str, episode: str, text: str, payload: dict[str, Any] | None = None
) -> bool:
    """Record the episode once and queue its delivery on commit (module docstring, "once
    per episode", "never in the way"); True when the row is new."""
    return bool(_record(kind, episode, text, payload))


def _record(
    kind: str, episode: str, text: str, payload: dict[str, Any] | None
) -> bool | None:
    """`notify`'s write: True (new), False (told already, or notifications are off), None
    (the database refused it)."""
    global _outage
    if not notify_url():
        return False
    kind = _cut(kind, KIND_CHARS)
    episode = _cut(episode, EPISODE_CHARS)
    row = Notification(
        kind=kind,
        episode=episode,
        text=message_text(text),
        # Plain JSON whatever the caller passed (a date, a set): stored as it reads.
        payload=json.loads(json.dumps(payload or {}, default=str)),
        state=NotificationState.PENDING,
        next_attempt_at=timezone.now(),
    )
    try:
        with transaction.atomic():  # a savepoint inside the caller's transaction
            if Notification.objects.filter(kind=kind, episode=episode).exists():
                return False
            row.save(force_insert=True)
    except IntegrityError:
        return False  # another process told the same episode at this very moment
    except DatabaseError as exc:
        _failed(f"{kind} {episode!r}", exc)
        return None
    _outage = False
    transaction.on_commit(lambda: notification_queue(row.id))
    return True


def notification_queue(notification_id: str, *, delay: float = 0.0) -> None:
    """The row's delivery as a task on the main cluster's queue (where drains run, never a
    run worker), visible after `delay` s; a database error is one line: the sweep sends the
    row when it is due."""
    try:
        main_task(
            NOTIFY_TASK,
            notification_id,
            task_name=f"notify-{notification_id}",
            delay=delay,
        )
    except DatabaseError as exc:
        logger.warning(
            "notification %s not queued (%s): the sweep sends it",
            notification_id,
            first_line(exc),
        )


def notification_claim(
    notification_id: str, *, now: datetime, hold: timedelta
) -> Notification | None:
    """The pending row, due by `now`, claimed for one try (its next try moved `hold`
    ahead, so no other sender posts it meanwhile); None when it is not (another has it,
    it is not due, or it is no longer pending)."""
    claimed = Notification.objects.filter(
        pk=notification_id,
        state=NotificationState.PENDING,
        next_attempt_at__lte=now,
    ).update(next_attempt_at=now + hold)
    return Notification.objects.get(pk=notification_id) if claimed == 1 else None


def _pending(notification_id: str) -> Any:
    return Notification.objects.filter(
        pk=notification_id, state=NotificationState.PENDING
    )


def notification_sent(notification_id: str, *, at: datetime) -> None:
    """The try went through: `sent`."""
    _pending(notification_id).update(
        state=NotificationState.SENT,
        sent_at=at,
        attempts=F("attempts") + 1,
        last_error=None,
        next_attempt_at=None,
    )


def notification_failed(notification_id: str, *, attempts: int, error: str) -> None:
    """The last try failed too: `failed`, shown on /ops/."""
    _pending(notification_id).update(
        state=NotificationState.FAILED,
        attempts=attempts,
        last_error=error,
        next_attempt_at=None,
    )


def notification_retry(
    notification_id: str, *, attempts: int, error: str, due: datetime
) -> None:
    """A try failed: the next is due at `due`."""
    _pending(notification_id).update(
        attempts=attempts, last_error=error, next_attempt_at=due
    )


def _guarded(what: str, read: Callable[[], T], default: T) -> T:
    """`read()` in a savepoint of its own, `default` when the database refuses it."""
    try:
        with transaction.atomic():
            return read()
    except DatabaseError as exc:
        _failed(what, exc)
        return default


def _link(item_id: str) -> str | None:
    base = str(getattr(settings, "LOOPSWEB_BASE_URL", "") or "")
    return f"{base}/ops/items/{item_id}/" if base else None


def _task_title(subject: Any) -> str | None:
    raw = subject.get("raw") if isinstance(subject, dict) else None
    if isinstance(raw, dict):
        for key in ("title", "message"):
            text = raw.get(key)
            if isinstance(text, str) and text.strip():
                return text.strip()
    return None


# --- the hooks ----------------------------------------------------------------------------


def notify_run_failed(
    *, item_id: str | None, run_id: str, status: str, error: str | None
) -> bool:
    """`run_failed`: the run ended its item for good (`failed` or `dead_letter`, no retry
    left). One episode per admission of the item: its id and its attempts."""
    if not notify_url() or not item_id:
        return False
    item = _guarded(
        f"{RUN_FAILED} {item_id}",
        lambda: (
            WorkflowWorkItem.objects.select_related("invocation")
            .filter(pk=item_id)
            .first()
        ),
        None,
    )
    if item is None:
        return False
    title = _task_title(item.invocation.subject_json)
    words = [f"Run failed for good: {item.idempotency_key}"]
    if title:
        words.append(f'task "{_cut(title, TITLE_CHARS)}"')
    words.append(f"item {item.status}, run {run_id} {status}")
    text = " — ".join(words)
    if error:
        text += f"\nError: {_cut(error.strip(), ERROR_CHARS)}"
    link = _link(item.id)
    if link:
        text += f"\n{link}"
    return notify(
        RUN_FAILED,
        f"{item.id}:{item.attempts}",
        text,
        {
            "workItemId": item.id,
            "attempts": item.attempts,
            "itemStatus": item.status,
            "runId": run_id,
            "runStatus": status,
            "title": _cut(title, TITLE_CHARS) if title else None,
            "error": _cut(error, ERROR_CHARS) if error else None,
            "projectKey": item.project_key,
            "link": link,
        },
    )


def notify_login_failed(*, account: str, reason: str, since: datetime) -> bool:
    """`login_failed`: the account's login was refused and it is marked so; one episode per
    mark (from the moment it was set until it is cleared)."""
    return notify(
        LOGIN_FAILED,
        f"{account}@{since.isoformat()}",
        f"Account {account}: its login was refused; it takes no work until "
        f"`account check {account}` passes or an operator enables it.\n"
        f"Reason: {_cut(reason.strip(), ERROR_CHARS)}",
        {
            "account": account,
            "since": since.isoformat(),
            "reason": reason[:ERROR_CHARS],
        },
    )


def pool_key(members: Iterable[str]) -> str:
    """The pool's part of its episodes' key: its members, sorted, joined."""
    joined = ",".join(sorted({str(m) for m in members}))
    if len(joined) <= POOL_KEY_CHARS:
        return joined
    digest = hashlib.sha256(joined.encode()).hexdigest()[:16]
    return f"{joined[: POOL_KEY_CHARS - 17]}#{digest}"


def _closed() -> Exists:
    return Exists(
        Notification.objects.filter(kind=POOL_AVAILABLE, episode=OuterRef("episode"))
    )


def notify_pool_exhausted(
    *,
    members: Collection[str],
    provider: str,
    until: datetime,
    now: datetime,
    waiting: str,
) -> bool:
    """`pool_exhausted`: every usable member of the pool cools and `waiting` waits for it.
    An episode of the pool still open (told, its `pool_available` not yet) is the same one:
    nothing new. The episode is the pool and the moment it was first met; the sweep tells
    `pool_available` with the same key once a member is free again
    (`notify_pools_available`)."""
    if not notify_url() or not members:
        return False
    key = pool_key(members)
    still_open = _guarded(
        f"{POOL_EXHAUSTED} {key!r}",
        lambda: (
            Notification.objects.filter(
                kind=POOL_EXHAUSTED, episode__startswith=f"{key}@"
            )
            .exclude(_closed())
            .exists()
        ),
        True,
    )
    if still_open:
        return False
    shown = ", ".join(sorted(members))
    return notify(
        POOL_EXHAUSTED,
        f"{key}@{now.isoformat()}",
        f"Pool {shown} ({provider}) is exhausted: every account is rate limited, "
        f"the first until {until.isoformat(timespec='minutes')}. Waiting: {waiting}.",
        {
            "members": sorted(members),
            "provider": provider,
            "since": now.isoformat(),
            "until": until.isoformat(),
            "waiting": waiting,
        },
    )


def notify_pools_available(now: datetime | None = None) -> list[str]:
    """The sweep's half of a pool's episode: each open `pool_exhausted` episode whose pool
    has a usable member that no longer cools is told `pool_available` (same episode key).
    One query when no episode is open. Returns the episodes closed."""
    if not notify_url():
        return []
    now = now or timezone.now()
    open_rows = list(
        Notification.objects.filter(kind=POOL_EXHAUSTED)
        .exclude(_closed())
        .values_list("episode", "payload")[:OPEN_EPISODES_READ]
    )
    if not open_rows:
        return []
    names = {
        str(m) for _, payload in open_rows for m in (payload or {}).get("members") or []
    }
    cooling = account_state(now=now).cooling
    registry = account_registry(names)
    closed = []
    for episode, payload in open_rows:
        members = [str(m) for m in (payload or {}).get("members") or []]
        provider = (payload or {}).get("provider")
        usable = [
            m
            for m in members
            if (row := registry.get(m)) is None
            or (row.enabled and (provider is None or row.provider == provider))
        ]
        if usable and all(m in cooling for m in usable):
            continue
        free = [m for m in usable if m not in cooling]
        text = f"Pool {', '.join(members)} is available again" + (
            f": {', '.join(free)} no longer rate limited." if free else "."
        )
        if notify(POOL_AVAILABLE, episode, text, {"members": members, "free": free}):
            closed.append(episode)
    return closed


# Host episodes this process has told (or found told): the heartbeat meets a dead host on
# every beat, and only the first meeting of a process writes (module docstring, "the hooks").
_hosts_told: set[str] = set()
_HOSTS_TOLD_MAX = 1000


def hosts_told_forget() -> None:
    """This process forgets which host episodes it told (a test; a process's own start)."""
    _hosts_told.clear()


def notify_host_gone(
    *, host: str, seen_at: datetime, ended: Collection[str] = ()
) -> bool:
    """`host_gone`: a host not heard from for LOOPSWEB_HOST_DEAD_SECONDS is declared gone
    (ledger.services.hostloss). One episode per silence: the host and its last report."""
    if not notify_url():
        return False
    episode = f"{host}@{seen_at.isoformat()}"
    if episode in _hosts_told:
        return False
    text = (
        f"Host {host} is gone: not heard from since "
        f"{seen_at.isoformat(timespec='seconds')}."
    )
    if ended:
        text += f" {len(ended)} running run(s) on it ended; their items are retried."
    new = _record(
        HOST_GONE,
        episode,
        text,
        {"host": host, "seenAt": seen_at.isoformat(), "runsEnded": list(ended)[:50]},
    )
    if new is not None:  # a refused write is tried again at the next beat
        if len(_hosts_told) >= _HOSTS_TOLD_MAX:
            _hosts_told.clear()
        _hosts_told.add(episode)
    return bool(new)


def notify_instances_silent(now: datetime | None = None) -> list[str]:
    """`cluster_silent` (the sweep): each run cluster instance that has not ended and has
    not reported for LOOPSWEB_HOST_DEAD_SECONDS (within SILENT_LOOKBACK) is told once; the
    episode is the instance. Returns the instances told."""
    if not notify_url():
        return []
    now = now or timezone.now()
    rows = list(
        ClusterInstance.objects.filter(
            cluster=True,
            ended_at__isnull=True,
            seen_at__lt=now - dead_after(),
            seen_at__gte=now - SILENT_LOOKBACK,
        )
        .order_by("seen_at")
        .values_list("instance", "host", "seen_at")[:INSTANCES_READ]
    )
    if not rows:
        return []
    told = set(
        Notification.objects.filter(
            kind=CLUSTER_SILENT, episode__in=[r[0] for r in rows]
        ).values_list("episode", flat=True)
    )
    found = []
    for instance, host, seen_at in rows:
        if instance in told:
            continue
        text = (
            f"Run cluster {instance} on host {host} stopped reporting: last seen "
            f"{seen_at.isoformat(timespec='seconds')}. Its workers run nothing new."
        )
        payload = {"instance": instance, "host": host, "seenAt": seen_at.isoformat()}
        if notify(CLUSTER_SILENT, instance, text, payload):
            found.append(instance)
    return found


# --- what /ops/ shows -----------------------------------------------------------------------


@dataclass(frozen=True)
class Undelivered:
    """The outbox as /ops/ shows it: pending and failed counts, the last failed rows."""

    pending: int
    failed: int
    failures: list[Notification]

    @property
    def on(self) -> bool:
        return bool(notify_url())

    @property
    def shown(self) -> bool:
        return self.on or bool(self.pending or self.failed)


def notifications_undelivered(limit: int = 5) -> Undelivered:
    """One query whatever the rows: the latest failed rows (up to `limit`), each carrying
    the counts of pending and failed rows (window aggregates, taken before the limit)."""
    failed_first = Case(
        When(state=NotificationState.FAILED, then=Value(0)),
        default=Value(1),
        output_field=IntegerField(),
    )
    rows = list(
        Notification.objects.filter(
            state__in=(NotificationState.PENDING, NotificationState.FAILED)
        )
        .annotate(
            failed_n=Window(
                Sum(
                    Case(
                        When(state=NotificationState.FAILED, then=Value(1)),
                        default=Value(0),
                        output_field=IntegerField(),
                    )
                )
            ),
            all_n=Window(Count("id")),
        )
        .only("id", "kind", "state", "last_error", "attempts", "created_at")
        .order_by(failed_first, "-created_at")[:limit]
    )
    failed = int(getattr(rows[0], "failed_n", 0) or 0) if rows else 0
    total = int(getattr(rows[0], "all_n", 0) or 0) if rows else 0
    return Undelivered(
        pending=total - failed,
        failed=failed,
        failures=[r for r in rows if r.state == NotificationState.FAILED],
    )
