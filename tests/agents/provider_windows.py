"""The rate-limit window headers the provider stand-in sends (tests/agents/provider.py): the
names and value shapes the real backends use, as the pinned CLIs read them (docs/windows.md
§1)."""

from __future__ import annotations


def window_headers(
    api: str, used: float, weekly_used: float, reset_5h: int, reset_7d: int
) -> dict[str, str]:
    """codex's `x-codex-*` on the OpenAI APIs; Anthropic's `anthropic-ratelimit-unified-*` on
    the Messages API (`allowed`; the 90 % surpassed threshold from 0.9; `rejected` at 1.0)."""
    if api == "messages":
        status = "rejected" if used >= 1.0 else "allowed"
        out = {
            "anthropic-ratelimit-unified-status": status,
            "anthropic-ratelimit-unified-reset": str(reset_5h),
            "anthropic-ratelimit-unified-representative-claim": "five_hour",
            "anthropic-ratelimit-unified-fallback": "available",
            "anthropic-ratelimit-unified-5h-utilization": f"{min(used, 1.0):.2f}",
            "anthropic-ratelimit-unified-5h-reset": str(reset_5h),
            "anthropic-ratelimit-unified-7d-utilization": f"{weekly_used:.2f}",
            "anthropic-ratelimit-unified-7d-reset": str(reset_7d),
            "anthropic-ratelimit-unified-overage-status": "rejected",
            "anthropic-ratelimit-unified-overage-disabled-reason": "org_level_disabled",
        }
        if 0.9 <= used < 1.0:
            out["anthropic-ratelimit-unified-5h-surpassed-threshold"] = "0.9"
        return out
    return {
        "x-codex-primary-used-percent": f"{min(used, 1.0) * 100:.1f}",
        "x-codex-primary-window-minutes": "300",
        "x-codex-primary-reset-at": str(reset_5h),
        "x-codex-secondary-used-percent": f"{weekly_used * 100:.1f}",
        "x-codex-secondary-window-minutes": "10080",
        "x-codex-secondary-reset-at": str(reset_7d),
    }
