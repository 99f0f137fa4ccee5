"""Ledger ids: 32 lowercase hex characters, a 48-bit millisecond timestamp then 80 random bits.

Ids sort by creation time (to the millisecond), like upstream's, so `ORDER BY id` is a cheap
creation order and ids from several machines never collide in practice.
"""

from __future__ import annotations

import os
import time


def new_id(now_ms: int | None = None) -> str:
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    return f"{ms & 0xFFFFFFFFFFFF:012x}{os.urandom(10).hex()}"


def id_timestamp_ms(value: str) -> int:
    """The creation time (ms since the epoch) encoded in an id."""
    return int(value[:12], 16)
