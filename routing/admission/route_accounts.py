"""The accounts of one route, planned without the store (a stage of `plan_route`): the pool
(the options', else the event's own), the role pins, the provider, whether the pool routes
(domain/templates.py, "pool routing"), the per-profile guard it records (domain.pool) and
the render-time account of each role."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from domain.errors import ValidationError
from domain.events import Envelope, first_string
from domain.pool import (
    PROFILE_NAME_INVALID,
    max_per_profile_recorded,
    parse_pool,
    valid_profile_name,
)
from domain.templates import pool_routing_active, resolve_role_profiles
from routing.admission.options import (
    POOL_METADATA_KEYS,
    ROLES,
    RouteOptions,
    route_provider,
)


@dataclass(frozen=True)
class RouteAccounts:
    pool: tuple[str, ...]
    pins: Mapping[str, str | None]
    provider: str
    pool_active: bool
    # The --max-per-profile the route records (0: off); it applies when the pool routes.
    max_per_profile: int | None
    profiles: Mapping[str, str | None]  # role -> its render-time account

    @property
    def policy(self) -> str:
        """The invocation's `accountPolicy`."""
        if any(self.pins.values()):
            return "role-explicit"
        return "pool" if self.pool else "single"

    @property
    def guard(self) -> int | None:
        """The per-profile guard the rendered steps carry (None: none)."""
        return (
            self.max_per_profile if self.pool_active and self.max_per_profile else None
        )


def event_pool(envelope: Envelope) -> list[str]:
    """The pool the event itself names (data, then metadata; POOL_METADATA_KEYS)."""
    for record in (envelope.data, envelope.metadata):
        value = first_string(dict(record), POOL_METADATA_KEYS)
        if value:
            return parse_pool(value)
        for key in POOL_METADATA_KEYS:
            if isinstance(record.get(key), list):
                return parse_pool(record[key])
    return []


def route_accounts(
    envelope: Envelope,
    options: RouteOptions,
    *,
    roles: tuple[str, ...],
    seed: str,
    registered: Mapping[str, str] | None,
) -> RouteAccounts:
    """The route's accounts (see the module docstring); ValidationError for an event pool
    member that is no account name."""
    pool = list(options.auth_profile_pool) or (
        [] if options.auth_profile else event_pool(envelope)
    )
    for member in pool:
        # The event's own pool reaches here unchecked by route_options.
        if not valid_profile_name(member.strip()):
            raise ValidationError(PROFILE_NAME_INVALID.format(name=member))
    pins = {role: options.pins.get(role) for role in ROLES}
    provider = route_provider(options, registered, pool)
    pool_active = pool_routing_active(
        provider=provider, pool=pool, pins=pins, registered=registered
    )
    return RouteAccounts(
        pool=tuple(pool),
        pins=pins,
        provider=provider,
        pool_active=pool_active,
        max_per_profile=max_per_profile_recorded(
            options.max_per_profile, pool_routes=pool_active
        ),
        profiles=resolve_role_profiles(
            roles=roles,
            pool=pool,
            seed=seed,
            auth_profile=options.auth_profile,
            pins=pins,
        ),
    )
