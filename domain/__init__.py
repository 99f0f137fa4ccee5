"""Pure route-admission domain: decisions over plain values, no ORM, no clock.

Everything here takes what it needs as arguments (counts, loads, ``now``, the
environment) so it can be unit-tested without a database and reused unchanged by
services, drains, dry-run plans and the ops pages.
"""

from __future__ import annotations
