"""Token usage (and cost) from an agent's machine-readable output: pure, no ORM.

Contract:
1. codex (`codex exec --json`) prints JSON Lines events; each `turn.completed` event carries
   `usage: {input_tokens, cached_input_tokens, output_tokens}`. The step's usage is the sum
   over its turns. codex reports no cost.
2. claude (`claude --print --output-format json`) prints one result object with
   `usage: {input_tokens, cache_creation_input_tokens, cache_read_input_tokens,
   output_tokens}` and `total_cost_usd`. Input counts every input token (cache reads and
   cache writes included); cached counts cache reads. The last result object wins.
3. opencode (`opencode run --format json`) prints JSON Lines events; each model call ends
   with a `step_finish` event whose `part` carries `tokens: {input, output, reasoning,
   cache: {read, write}}` and `cost`. opencode's `input` leaves the cache out, so input is
   input + cache reads + cache writes and cached is cache reads (as for claude); the
   step's usage and cost are the sums over its calls.
4. Any other provider, or output in which no usage could be read, gives None. Lines that
   are not JSON (a banner, a dropped-bytes marker, a truncated first line of the tail) are
   skipped; nothing here raises on bad output, so usage never fails a step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Usage:
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    cost_usd: float | None = None


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


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
# ledger.agent_output shares.
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
    return Usage(
        input_tokens=total_in, output_tokens=total_out, cached_tokens=total_cached
    )


def _claude(objects: list[dict[str, Any]]) -> Usage | None:
    for event in reversed(objects):
        usage = event.get("usage")
        if event.get("type") != "result" or not isinstance(usage, dict):
            continue
        inp, out = _int(usage.get("input_tokens")), _int(usage.get("output_tokens"))
        if inp is None and out is None:
            continue
        read = _int(usage.get("cache_read_input_tokens")) or 0
        created = _int(usage.get("cache_creation_input_tokens")) or 0
        cost = event.get("total_cost_usd")
        return Usage(
            input_tokens=(inp or 0) + read + created,
            output_tokens=out or 0,
            cached_tokens=read,
            cost_usd=float(cost)
            if isinstance(cost, int | float)
            and not isinstance(cost, bool)
            and cost >= 0
            else None,
        )
    return None


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
        value = part.get("cost")
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            cost += float(value)
    if not seen:
        return None
    return Usage(
        input_tokens=total_in,
        output_tokens=total_out,
        cached_tokens=total_cached,
        cost_usd=cost,
    )


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
