"""Input limits: event and ingest sizes, drains' batches, the API's."""

from __future__ import annotations

from loopsweb.settings.env import (
    env_int,
)

# Largest event envelope (or request body) accepted, in bytes.
LOOPSWEB_MAX_EVENT_BYTES = env_int("LOOPSWEB_MAX_EVENT_BYTES", 1024 * 1024)

# Largest JSON-array file `ingest_events` loads at once (JSON Lines files stream, unbounded).
LOOPSWEB_MAX_INGEST_BYTES = env_int("LOOPSWEB_MAX_INGEST_BYTES", 256 * 1024 * 1024)
# How long a drain that lost its database connection keeps trying to store its record.
LOOPSWEB_DRAIN_RECORD_WAIT_SECONDS = env_int("LOOPSWEB_DRAIN_RECORD_WAIT_SECONDS", 30)
# Most candidates a drain decides in one admission transaction (one lock hold, counts read
# once, rows written in bulk); 1 routes them one at a time.
LOOPSWEB_DRAIN_BATCH_SIZE = env_int("LOOPSWEB_DRAIN_BATCH_SIZE", 50)
# Arriving events wake the drain schedules that take them (routing.drains.wake): at most one
# woken drain per schedule per this many seconds; 0 turns wake-ups off (the schedules alone).
LOOPSWEB_INGEST_WAKE_SECONDS = env_int("LOOPSWEB_INGEST_WAKE_SECONDS", 1)
# Largest output accepted from a drain's --source-command, in bytes.
LOOPSWEB_SOURCE_MAX_BYTES = env_int("LOOPSWEB_SOURCE_MAX_BYTES", 16 * 1024 * 1024)

# --- api ---
# The event API (routing.api.views), API tokens and /metrics. Read through django.conf.settings
# at request time, so tests may override them. The request body limit is
# LOOPSWEB_MAX_EVENT_BYTES above: one limit for one envelope, whatever the entry point.

# Most envelopes in one POST /api/v1/events array (larger batches: ingest_events).
LOOPSWEB_API_MAX_EVENTS = env_int("LOOPSWEB_API_MAX_EVENTS", 1000)
# Deepest bracket nesting of one envelope (API, ingest_events, route_event). Checked on the
# text before parsing, so a hostile body cannot exhaust the parser's recursion.
LOOPSWEB_MAX_JSON_DEPTH = env_int("LOOPSWEB_MAX_JSON_DEPTH", 32)
# --- end api ---
