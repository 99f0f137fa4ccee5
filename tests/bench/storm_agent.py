#!/usr/bin/env python3
"""The storm benchmark's windows stand-in (tests/bench/bench_storm.py), as a claude binary:
each account has a scripted capacity per rate-limit window, and its windows reset on a
compressed clock. Standard library only.

Each invocation is one request with the step's account (`LOOPSWEB_ACCOUNT_PROFILE`). Under a
lock on the state directory it is counted in the account's current window: account i of
FAKE_AGENT_STORM_ACCOUNTS (comma list) has windows of FAKE_AGENT_STORM_WINDOW seconds whose
boundaries are FAKE_AGENT_STORM_EPOCH + k × window + round(i × window / n) (staggered, so
the pool's resets differ; whole epoch seconds, as claude names a reset), and each window
answers FAKE_AGENT_STORM_CAPACITY requests.

- Within the capacity, the request is answered: the window's state after it is printed at
  once as claude's `rate_limit_event` (stream-json, docs/windows.md §1: `allowed`, at 90 %
  `allowed_warning` with its `utilization`, `rejected` once the capacity is used; `resetsAt`
  the window's reset, `rateLimitType` `five_hour`), then scripts/fake-agent runs the step
  (FAKE_AGENT_SLEEP as the work) and prints claude's success `result`.
- Past it, the window answers 429 as the real claude reports a spent subscription window:
  a `rate_limit_event` with `rejected` and the reset, then an error `result` with
  `"api_error_status":429` whose message names the reset (`resets at <ISO time>`); exit 1.

Every request is written to FAKE_AGENT_STORM_DIR/requests.jsonl (account, step, run, when it
started and ended, its window, whether it was answered) for the benchmark to read.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

FAKE_AGENT = Path(__file__).resolve().parents[2] / "scripts" / "fake-agent"
WARNING_AT = 0.9


def _window(account: str, now: float) -> tuple[int, float]:
    """(index of the account's current window, its reset as epoch seconds)."""
    accounts = os.environ["FAKE_AGENT_STORM_ACCOUNTS"].split(",")
    epoch = int(os.environ["FAKE_AGENT_STORM_EPOCH"])
    length = int(os.environ["FAKE_AGENT_STORM_WINDOW"])
    position = accounts.index(account) if account in accounts else 0
    offset = epoch + round(length * position / len(accounts))
    index = int((now - offset) // length)
    return index, float(offset + (index + 1) * length)


def _count(state_dir: Path, account: str, now: float) -> tuple[int, float, int, bool]:
    """Count one request under the lock: (window, reset, used after it, answered)."""
    capacity = int(os.environ["FAKE_AGENT_STORM_CAPACITY"])
    with open(state_dir / "state.lock", "a+", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = state_dir / "state.json"
        state = json.loads(path.read_text()) if path.exists() else {}
        window, reset = _window(account, now)
        key = f"{account}/{window}"
        used = int(state.get(key, 0))
        answered = used < capacity
        if answered:
            used += 1
            state[key] = used
            path.write_text(json.dumps(state))
        return window, reset, used, answered


def _event(status: str, reset: float, utilization: float | None) -> str:
    info: dict[str, object] = {
        "status": status,
        "resetsAt": int(reset),
        "rateLimitType": "five_hour",
    }
    if utilization is not None:
        info["utilization"] = round(utilization, 2)
    return json.dumps({"type": "rate_limit_event", "rate_limit_info": info})


def _record(state_dir: Path, entry: dict[str, object]) -> None:
    with open(state_dir / "requests.jsonl", "a", encoding="utf-8") as out:
        out.write(json.dumps(entry) + "\n")


def main() -> int:
    state_dir = Path(os.environ["FAKE_AGENT_STORM_DIR"])
    account = os.environ.get("LOOPSWEB_ACCOUNT_PROFILE", "")
    capacity = int(os.environ["FAKE_AGENT_STORM_CAPACITY"])
    started = time.time()
    window, reset, used, answered = _count(state_dir, account, started)
    entry: dict[str, object] = {
        "id": uuid.uuid4().hex,
        "account": account,
        "step": os.environ.get("LOOPSWEB_STEP_ID"),
        "run": os.environ.get("LOOPSWEB_RUN_ID"),
        "start": started,
        "window": window,
        "reset": reset,
        "used": used,
        "answered": answered,
    }
    _record(state_dir, entry)
    env = dict(os.environ)
    if answered:
        fraction = used / capacity
        status = (
            "rejected"
            if fraction >= 1.0
            else "allowed_warning"
            if fraction >= WARNING_AT
            else "allowed"
        )
        warning = fraction if status == "allowed_warning" else None
        print(_event(status, reset, warning), flush=True)
        env["FAKE_AGENT_OUTPUT"] = json.dumps(
            {
                "type": "result",
                "subtype": "success",
                "is_error": False,
                "result": "Done.",
                "usage": {"input_tokens": 1200, "output_tokens": 40},
            }
        )
    else:
        when = datetime.fromtimestamp(reset, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        env["FAKE_AGENT_OUTPUT"] = "\n".join(
            [
                _event("rejected", reset, None),
                json.dumps(
                    {
                        "type": "result",
                        "subtype": "success",
                        "is_error": True,
                        "api_error_status": 429,
                        "result": "API Error: Request rejected (429) · Your 5-hour usage "
                        f"limit is reached; it resets at {when}",
                    }
                ),
            ]
        )
        env["FAKE_AGENT_SLEEP"] = "0"
        env["FAKE_AGENT_EXIT"] = "1"
    code = subprocess.call([sys.executable, str(FAKE_AGENT), *sys.argv[1:]], env=env)
    _record(state_dir, {"id": entry["id"], "end": time.time(), "exit": code})
    return code


if __name__ == "__main__":
    sys.exit(main())
