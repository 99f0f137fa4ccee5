"""Auth-profile pool assignment (OpenLoops 0.4.12 docs/upstream.md §4).

Contract:
1. ``stable_index`` is 32-bit FNV-1a over the seed's UTF-16 code units, modulo ``size``;
   it must equal upstream's JavaScript ``stableIndex`` for every string.
2. Roles are assigned in the order worker, verifier, planner, triage, then any other
   role in the order given; each role starts its walk at ``(hash + offset) mod n``
   with offsets worker 0, verifier 1, planner 2, anything else 3.
3. Each role gets the least-loaded member, preferring members no earlier role took;
   ties resolve in walk order, so equal loads reproduce the render-time hash pick.
4. Loads are a snapshot and are not incremented between roles.
5. ``max_per_profile`` (an int > 0) defers the whole route when every member already
   carries that many; ``None`` or 0 disables the guard.
6. **Removals** (a loopsweb extension): ``disabled`` members (switched off in the account
   registry) are removed first; when every member is disabled the route is deferred with
   reason code ``account_disabled``. Then ``cooling`` members are removed; when every
   remaining member is cooling the route is deferred with reason code ``cooldown``. Then
   members at their own registry cap (``account_caps``: load >= cap) are removed; when none
   is left the route is deferred with ``profile_cap``. With none of these the result is
   exactly upstream's.
   Between cooling and the caps, members whose rate-limit window is spent (``windows``,
   domain.windows) are removed; when none is left the route is deferred with
   ``window_exhausted``, the reason naming each member's window and the earliest reset;
   then members ahead of their window pace, deferring with ``window_paced``.
   Among members of equal load, the one with more window headroom wins; with no window
   known every headroom is equal and the walk order decides, as upstream.
7. ``valid_profile_name`` is the shape every account name must have: it lands next to
   flags on an agent's command line, so it never starts with ``-`` and holds no spaces.
8. **Worker ≠ verifier**, always (loopsweb). When the removals leave one member, the worker
   takes it and the verifier takes the least-loaded other member that was set aside for a
   while (cooling, a spent window, at its cap), so it moves or waits at its own start
   (ledger/services/failover.py, "worker ≠ verifier"); when every other member is disabled
   or its login failed, the route is deferred (``login_failed`` or ``account_disabled``).
   Upstream lets both roles share the one member.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from domain import reasons
from domain.windows import WindowFilter

FNV_OFFSET_BASIS = 2166136261
FNV_PRIME = 16777619

ROLE_ORDER: tuple[str, ...] = ("worker", "verifier", "planner", "triage")

PROFILE_CAP_REASON = (
    "per-profile active limit reached "
    "(all {n} pool members >= {limit} running; min {min_load})"
)
COOLDOWN_REASON = "all {n} pool members cooling down"
DISABLED_REASON = "all {n} pool members disabled in the account registry"
LOGIN_FAILED_REASON = "account {name}: login failed"
UNRESPONSIVE_REASON = "account {name}: unresponsive (a step hung on it)"


class HangMark:
    """An account row's `unresponsive` mark (a step hung on it, 0026): until when (None: no
    mark); in force while that lies ahead."""

    unresponsive_until: datetime | None

    def unresponsive_at(self, now: datetime) -> bool:
        return self.unresponsive_until is not None and self.unresponsive_until > now


SEPARATE_VERIFIER_REASON = (
    "worker ≠ verifier: no pool member but {worker} can take the verifier ({why})"
)
ACCOUNT_CAP_REASON = "every pool member is at its own running cap (min {min_load})"
PROFILE_NAME_INVALID = (
    "account name {name!r} is not valid: letters, digits and _ . @ + : = - only, "
    "not starting with - (at most 200 characters)"
)

_PROFILE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@+:=-]{0,199}$")


def valid_profile_name(name: str) -> bool:
    """True when ``name`` may be an account name (``valid_profile_name``, module
    docstring)."""
    return bool(_PROFILE_RE.match(name))


@dataclass(frozen=True)
class PoolAssignment:
    profiles: dict[str, str] = field(default_factory=dict)
    deferred: bool = False
    min_load: int = 0
    reason: str | None = None
    reason_code: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "profiles": dict(self.profiles),
            "deferred": self.deferred,
            "minLoad": self.min_load,
        }
        if self.reason is not None:
            out["reason"] = self.reason
        if self.reason_code is not None:
            out["reasonCode"] = self.reason_code
        return out


def fnv1a_32(seed: str) -> int:
    """32-bit FNV-1a over UTF-16 code units, as JavaScript's ``charCodeAt`` sees them."""
    h = FNV_OFFSET_BASIS
    # surrogatepass: a lone surrogate is one code unit in JS too, so hash it rather
    # than failing on strings that came from loosely-encoded JSON.
    data = seed.encode("utf-16-le", "surrogatepass")
    for i in range(0, len(data), 2):
        unit = data[i] | (data[i + 1] << 8)
        h = ((h ^ unit) * FNV_PRIME) & 0xFFFFFFFF
    return h


def stable_index(seed: str, size: int) -> int:
    if size <= 0:
        raise ValueError("size must be positive")
    return fnv1a_32(seed) % size


def role_offset(role: str) -> int:
    if role == "worker":
        return 0
    if role == "verifier":
        return 1
    if role == "planner":
        return 2
    return 3


def order_roles(roles: Iterable[str]) -> list[str]:
    given = list(roles)
    ordered = [role for role in ROLE_ORDER if role in given]
    for role in given:
        if role not in ordered:
            ordered.append(role)
    return ordered


def drop_blank(pool: Iterable[str]) -> list[str]:
    # Upstream filters on ``entry.trim()`` but keeps the entry untrimmed; so do we,
    # so a pool with stray spaces hashes to the same members as upstream.
    return [entry for entry in pool if entry.strip()]


def parse_pool(value: object) -> list[str]:
    """A pool as an option, a stored drain or an event gives it: comma-separated text
    (members trimmed) or a list (members kept as given, blank ones dropped: ``drop_blank``);
    anything else (None, a number) is no pool. The one parse of a pool."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, list | tuple):
        return drop_blank([str(member) for member in value])
    return []


# --max-per-profile when a routed pool has none (upstream's default).
DEFAULT_MAX_PER_PROFILE = 2


def max_per_profile_recorded(option: int | None, *, pool_routes: bool) -> int | None:
    """The --max-per-profile a route records: the option, or DEFAULT_MAX_PER_PROFILE when
    its pool routes and none was given (0 stays 0: the guard is off)."""
    return DEFAULT_MAX_PER_PROFILE if pool_routes and option is None else option


def max_per_profile_in_force(option: int | None, *, pool_routes: bool) -> int | None:
    """The per-profile guard that applies: ``max_per_profile_recorded``, None when the
    pool does not route or the option is 0. The one home of that rule (admission, the
    drains' caps, /ops/ and /metrics read it)."""
    if not pool_routes:
        return None
    return max_per_profile_recorded(option, pool_routes=True) or None


def select_least_loaded(
    pool: Sequence[str],
    load_counts: Mapping[str, int],
    anchor: int,
    exclude: Collection[str],
    headroom: Mapping[str, float] | None = None,
) -> str:
    """Least-loaded member walking ``pool`` from ``anchor`` (docs/upstream.md §4.3).

    A later member replaces the current best only when strictly better under
    (not excluded before excluded, then lower load, then more ``headroom``: missing
    headroom counts as 1.0); missing loads count as 0.
    """
    rooms = headroom or {}
    size = len(pool)
    if size == 0:
        raise ValueError("pool must not be empty")
    best: str | None = None
    best_excluded = True
    best_load = 0
    for k in range(size):
        profile = pool[(anchor + k) % size]
        excluded = profile in exclude
        load = load_counts.get(profile, 0)
        if best is None:
            best, best_excluded, best_load = profile, excluded, load
            continue
        if excluded == best_excluded:
            better = load < best_load or (
                load == best_load and rooms.get(profile, 1.0) > rooms.get(best, 1.0)
            )
        else:
            better = not excluded and best_excluded
        if better:
            best, best_excluded, best_load = profile, excluded, load
    assert best is not None
    return best


def _guard_limit(max_per_profile: int | None) -> int | None:
    # Upstream guards on "a number > 0"; None and 0 both mean "spread only, never defer".
    if isinstance(max_per_profile, bool) or not isinstance(max_per_profile, int):
        return None
    return max_per_profile if max_per_profile > 0 else None


# A removal (module docstring, "removals"): the members it sets aside, its reason code, and
# the reason it gives when it would empty the pool (given the members left before it).
_Removal = tuple[Collection[str], str, Callable[[Sequence[str]], str]]


def assign_pool_auth_profiles(
    pool: Sequence[str],
    load_counts: Mapping[str, int],
    seed: str,
    roles: Iterable[str],
    max_per_profile: int | None = None,
    *,
    cooling: Collection[str] = (),
    disabled: Collection[str] = (),
    login_failed: Collection[str] = (),
    unresponsive: Collection[str] = (),
    account_caps: Mapping[str, int] | None = None,
    windows: WindowFilter | None = None,
) -> PoolAssignment:
    """Choose one profile per role from ``pool`` (docs/upstream.md §4.4 plus cooldown).

    1. Drop blank entries; an empty pool assigns nothing and does not defer.
    2. Remove disabled members, then those whose login failed, then unresponsive ones (a
       step hung on them), then cooling ones; when a removal empties the pool, defer with
       ``account_disabled``, ``login_failed`` (the reason names them: ``account NAME:
       login failed``), ``unresponsive`` (named too) or ``cooldown``.
    3. ``min_load`` is the minimum load over the remaining members.
    4. Guard: defer with ``profile_cap`` when ``max_per_profile > 0`` and
       ``min_load >= max_per_profile``.
    5. Otherwise assign roles in ``order_roles`` order, each excluding earlier picks.
    """
    members = drop_blank(pool)
    if not members:
        return PoolAssignment()

    removals = _removals(disabled, login_failed, unresponsive, cooling, windows)
    available = _remove_unavailable(members, load_counts, removals)
    if isinstance(available, PoolAssignment):
        return available
    if account_caps:
        available = _below_account_caps(available, load_counts, account_caps)
        if isinstance(available, PoolAssignment):
            return available
    members = available

    min_load = min(load_counts.get(entry, 0) for entry in members)
    limit = _guard_limit(max_per_profile)
    if limit is not None and min_load >= limit:
        return PoolAssignment(
            deferred=True,
            min_load=min_load,
            reason=PROFILE_CAP_REASON.format(
                n=len(members), limit=limit, min_load=min_load
            ),
            reason_code=reasons.PROFILE_CAP,
        )

    profiles = _assign_roles(members, load_counts, seed, roles, windows)
    if profiles.get("verifier") is not None and profiles.get(
        "verifier"
    ) == profiles.get("worker"):
        return _separate_verifier(
            profiles, drop_blank(pool), load_counts, min_load, disabled, login_failed
        )
    return PoolAssignment(profiles=profiles, deferred=False, min_load=min_load)


def _removals(
    disabled: Collection[str],
    login_failed: Collection[str],
    unresponsive: Collection[str],
    cooling: Collection[str],
    windows: WindowFilter | None,
) -> list[_Removal]:
    """The removals (module docstring, "removals"), in the order they apply."""
    removals: list[_Removal] = [
        (
            disabled,
            reasons.ACCOUNT_DISABLED,
            lambda left: DISABLED_REASON.format(n=len(left)),
        ),
        (
            login_failed,
            reasons.LOGIN_FAILED,
            lambda left: "; ".join(
                LOGIN_FAILED_REASON.format(name=entry.strip()) for entry in left
            ),
        ),
        (
            unresponsive,
            reasons.UNRESPONSIVE,
            lambda left: "; ".join(
                UNRESPONSIVE_REASON.format(name=entry.strip()) for entry in left
            ),
        ),
        (cooling, reasons.COOLDOWN, lambda left: COOLDOWN_REASON.format(n=len(left))),
    ]
    if windows is not None:  # after the others: spent windows, then paced ones
        removals += [
            (windows.exhausted, reasons.WINDOW_EXHAUSTED, windows.reason),
            (windows.paced, reasons.WINDOW_PACED, windows.paced_reason),
        ]
    return removals


def _remove_unavailable(
    members: list[str], load_counts: Mapping[str, int], removals: Iterable[_Removal]
) -> list[str] | PoolAssignment:
    """The members no removal sets aside, or the deferral of the first removal that would
    leave none."""
    for removed, code, reason in removals:
        if not removed:
            continue
        kept = [entry for entry in members if entry not in removed]
        if not kept:
            return PoolAssignment(
                deferred=True,
                min_load=min(load_counts.get(entry, 0) for entry in members),
                reason=reason(members),
                reason_code=code,
            )
        members = kept
    return members


def _below_account_caps(
    members: list[str], load_counts: Mapping[str, int], account_caps: Mapping[str, int]
) -> list[str] | PoolAssignment:
    """The members below their own registry cap, or the ``profile_cap`` deferral when
    none is."""
    free = [
        entry
        for entry in members
        if entry not in account_caps or load_counts.get(entry, 0) < account_caps[entry]
    ]
    if not free:
        min_load = min(load_counts.get(entry, 0) for entry in members)
        return PoolAssignment(
            deferred=True,
            min_load=min_load,
            reason=ACCOUNT_CAP_REASON.format(min_load=min_load),
            reason_code=reasons.PROFILE_CAP,
        )
    return free


def _assign_roles(
    members: Sequence[str],
    load_counts: Mapping[str, int],
    seed: str,
    roles: Iterable[str],
    windows: WindowFilter | None,
) -> dict[str, str]:
    """One member per role, in ``order_roles`` order, each preferring members no earlier
    role took (module docstring: "roles are assigned in the order", "each role gets the
    least-loaded member")."""
    worker_index = stable_index(seed, len(members))
    profiles: dict[str, str] = {}
    taken: set[str] = set()
    for role in order_roles(roles):
        anchor = (worker_index + role_offset(role)) % len(members)
        profile = select_least_loaded(
            members,
            load_counts,
            anchor,
            taken,
            windows.headroom if windows is not None else None,
        )
        profiles[role] = profile
        taken.add(profile)
    return profiles


def _separate_verifier(
    profiles: dict[str, str],
    pool: Sequence[str],
    load_counts: Mapping[str, int],
    min_load: int,
    disabled: Collection[str],
    login_failed: Collection[str],
) -> PoolAssignment:
    """Worker ≠ verifier (module docstring): the only member left took the worker; the
    verifier gets the least-loaded member set aside for a while (cooling, spent window, at a
    cap), and moves or waits at its start. Deferred when every other member is disabled or
    its login failed (or the pool names one account twice)."""
    worker = profiles["worker"]
    others = [m for m in pool if m != worker]
    usable = [m for m in others if m not in disabled and m not in login_failed]
    if not usable:
        failed = [m for m in others if m in login_failed]
        return PoolAssignment(
            deferred=True,
            min_load=min_load,
            reason=SEPARATE_VERIFIER_REASON.format(
                worker=worker,
                why="; ".join(LOGIN_FAILED_REASON.format(name=m) for m in failed)
                or (
                    "every other member is disabled"
                    if others
                    else "the pool names no other account"
                ),
            ),
            reason_code=reasons.LOGIN_FAILED if failed else reasons.ACCOUNT_DISABLED,
        )
    verifier = select_least_loaded(usable, load_counts, 0, ())
    return PoolAssignment(
        profiles={**profiles, "verifier": verifier}, deferred=False, min_load=min_load
    )


def render_time_profile(pool: Sequence[str], seed: str, role: str) -> str | None:
    """The deterministic hash pick used when rendering a template (no load data)."""
    members = drop_blank(pool)
    if not members:
        return None
    worker_index = stable_index(seed, len(members))
    if len(members) == 1:
        return members[0]
    return members[(worker_index + role_offset(role)) % len(members)]
