"""Token usage (and cost) from an agent's machine-readable output: pure, no ORM.

Contract:
1. codex (`codex exec --json`) prints JSON Lines events; each `turn.completed` event carries
   `usage: {input_tokens, cached_input_tokens, output_tokens}`. The step's usage is the sum
   over its turns. codex reports no cost.
2. claude (`claude --print --output-format json`) prints one result object with
   `usage: {input_tokens, cache_creation_input_tokens, cache_read_input_tokens,
   output_tokens}` and `total_cost_usd`. Input counts every input token (cache reads and
   cache writes included); cached counts cache reads. A step's result objects are summed
   (claude prints one; never "the last wins": a forged zero line cannot erase a real one).
3. opencode (`opencode run --format json`) prints JSON Lines events; each model call ends
   with a `step_finish` event whose `part` carries `tokens: {input, output, reasoning,
   cache: {read, write}}` and `cost`. opencode's `input` leaves the cache out, so input is
   input + cache reads + cache writes and cached is cache reads (as for claude); the
   step's usage and cost are the sums over its calls.
4. Bounded, since the output is the agent's to write: each value is clamped to MAX_TOKENS
   (and each sum), a cost to MAX_COST_USD, and a cost that is not a finite number is none;
   the ledger's sums over many steps then stay far inside a 64-bit integer on either
   database, and no API or `/metrics` answer carries NaN or Infinity.
5. Any other provider, or output in which no usage could be read, gives None. Lines that
   are not JSON (a banner, a dropped-bytes marker, a truncated first line of the tail) are
   skipped; nothing here raises on bad output, so usage never fails a step.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

# Per step: a thousand model calls of a million tokens each; a dollar figure to match.
MAX_TOKENS = 10**9
MAX_COST_USD = 100_000.0


@dataclass(frozen=True)
class Usage:
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    cost_usd: float | None = None


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return min(value, MAX_TOKENS)


def _cost(value: Any) -> float | None:
    """A cost the agent reported: a finite, non-negative number, clamped; else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    if not math.isfinite(number) or number < 0:
        return None
    return min(number, MAX_COST_USD)


def _bounded(
    input_tokens: int, output_tokens: int, cached_tokens: int, cost: float | None = None
) -> Usage:
    return Usage(
        input_tokens=min(input_tokens, MAX_TOKENS),
        output_tokens=min(output_tokens, MAX_TOKENS),
        cached_tokens=min(cached_tokens, MAX_TOKENS),
        cost_usd=None if cost is None else min(cost, MAX_COST_USD),
    )


def _objects(text: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict):
            out.append(value)
    if not out:
        # claude may pretty-print; try the whole text as one object.
        try:
            value = json.loads(text.strip() or "null")
        except (ValueError, RecursionError):
            value = None
        if isinstance(value, dict):
            out.append(value)
    return out


# The JSON objects of an output (JSON Lines, or one pretty-printed object): the parsing
# agents.agent_output shares.
json_objects = _objects


def _codex(objects: list[dict[str, Any]]) -> Usage | None:
    total_in = total_out = total_cached = 0
    seen = False
    for event in objects:
        usage = event.get("usage")
        if event.get("type") != "turn.completed" or not isinstance(usage, dict):
            continue
        inp, out = _int(usage.get("input_tokens")), _int(usage.get("output_tokens"))
        if inp is None and out is None:
            continue
        seen = True
        total_in += inp or 0
        total_out += out or 0
        total_cached += _int(usage.get("cached_input_tokens")) or 0
    if not seen:
        return None
    return _bounded(total_in, total_out, total_cached)


def _claude(objects: list[dict[str, Any]]) -> Usage | None:
    total_in = total_out = total_cached = 0
    cost: float | None = None
    seen = False
    for event in objects:
        usage = event.get("usage")
        if event.get("type") != "result" or not isinstance(usage, dict):
            continue
        inp, out = _int(usage.get("input_tokens")), _int(usage.get("output_tokens"))
        if inp is None and out is None:
            continue
        seen = True
        read = _int(usage.get("cache_read_input_tokens")) or 0
        created = _int(usage.get("cache_creation_input_tokens")) or 0
        total_in += (inp or 0) + read + created
        total_out += out or 0
        total_cached += read
        found = _cost(event.get("total_cost_usd"))
        if found is not None:
            cost = (cost or 0.0) + found
    if not seen:
        return None
    return _bounded(total_in, total_out, total_cached, cost)


def _opencode(objects: list[dict[str, Any]]) -> Usage | None:
    total_in = total_out = total_cached = 0
    cost = 0.0
    seen = False
    for event in objects:
        part = event.get("part")
        if event.get("type") != "step_finish" or not isinstance(part, dict):
            continue
        tokens = part.get("tokens")
        if not isinstance(tokens, dict):
            continue
        inp, out = _int(tokens.get("input")), _int(tokens.get("output"))
        if inp is None and out is None:
            continue
        seen = True
        cache = found if isinstance(found := tokens.get("cache"), dict) else {}
        read = _int(cache.get("read")) or 0
        total_in += (inp or 0) + read + (_int(cache.get("write")) or 0)
        total_out += out or 0
        total_cached += read
        cost += _cost(part.get("cost")) or 0.0
    if not seen:
        return None
    return _bounded(total_in, total_out, total_cached, cost)


PARSERS = {"codex": _codex, "claude": _claude, "opencode": _opencode}


def parse_usage(provider: str | None, stdout: str) -> Usage | None:
    """The usage an agent of `provider` reported on stdout, or None (see the contract)."""
    parser = PARSERS.get(provider or "")
    if parser is None or not stdout:
        return None
    try:
        return parser(_objects(stdout))
    except Exception:  # usage is a record, never a reason to fail a step
        return None
