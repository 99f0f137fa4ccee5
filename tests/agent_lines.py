"""Lines an agent CLI prints, written the way the pinned CLI writes them (docs/agents.md),
for tests that hand them to the fake agent or put them in a step's output."""

from __future__ import annotations

import json


def claude_stream(
    said: str,
    *,
    cost: float,
    earlier: str = "Checking.",
    usage: dict[str, int] | None = None,
) -> str:
    """claude's `--output-format stream-json --verbose` of a step that succeeded: its start,
    a message it said on the way (`earlier`), and the `result` with its last words (`said`),
    its cost and usage."""
    events = (
        {"type": "system", "subtype": "init", "model": "stub", "cwd": "."},
        {
            "type": "assistant",
            "message": {"content": [{"type": "text", "text": earlier}]},
        },
        {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "result": said,
            "total_cost_usd": cost,
            "usage": usage or {"input_tokens": 0, "output_tokens": 0},
        },
    )
    return "\n".join(json.dumps(event) for event in events)
