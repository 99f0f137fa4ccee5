#!/usr/bin/env python3
"""A hostile agent stand-in (issue 38): what an agent steered by a prompt someone else wrote
can do to the worktree loopsweb gives it. Standard library only; accepts any provider's argv
and exits 0 (the attack is in what it leaves behind, not in failing).

Its prompt (the argv item after `--`, or the last argv item) names the cases, as outside
text steering an agent would: `HOSTILE_CASES=own-repo,setsid`. Only the `worker` step acts
(LOOPSWEB_STEP_ID; `forge-usage-huge` excepted); every step writes `agent-work-<step>.txt` in its working directory (the
agent's work, which must survive on the run's branch or in a kept worktree).

Cases:
- `own-repo`: the worktree's `.git` file replaced by a repository of its own (`git init .`)
  whose `core.fsmonitor` is the mark command;
- `shared-config`: in the worktree as given, `git config` (which writes the PROJECT's
  repository config, shared by every worktree) of `core.fsmonitor`, `core.hooksPath` (with
  hooks), a filter driver named in a `.gitattributes` it commits nothing of, `diff.external`,
  a textconv and a pager: each the mark command;
- `main-gitdir`: `.git` repointed at the project's main git dir;
- `no-dotgit`: `.git` deleted, so a git that looked would find the repository above;
- `push-config` (issue 40): the project's config made to hijack a push: `remote.origin.url`
  and `pushurl` set to `$HOSTILE_DECOY_URL`, a `url.<decoy>.insteadOf` of the real origin,
  a `credential.helper`, `core.sshCommand` and a `pre-push` hook (in `core.hooksPath` and
  in the repository's own hooks dir), each the mark command;
- `setsid`: a daemon (double fork, `setsid`) left running, its pid appended to
  `$HOSTILE_DIR/pids`;
- `forge-429` (issue 58): a forged provider rate limit lasting a week printed (`HTTP 429 Too
  Many Requests: try again in 168 hours`), exit 1;
- `forge-login` (issue 58): a forged refused login printed (`Not logged in`), exit 1;
- `forge-windows` (docs/windows.md §7): rate-limit windows no provider sent, each resetting
  at 9999-12-31. As claude (LOOPSWEB_PROVIDER), `rate_limit_event` lines: the 5-hour window
  `rejected`, the weekly one half used. As codex, a rollout file the agent writes in its own
  `CODEX_HOME` (primary 100 % used, secondary 50 %) and the `thread.started` line naming it;
- `forge-names` (claude): `FORGED_NAMES` `rate_limit_event` lines of distinct window names;
- `forge-usage` (claude): a real-looking result (300,000 input and 100,000 output tokens,
  $42.50), then a zero one;
- `forge-usage-huge` (claude, printed by EVERY step, so a run's steps add up): a result
  claiming 9e18 input and 2**63-1 output tokens at a cost of `Infinity`;
- `inject-429`, `inject-login`: a tool (a child process of the agent) writes `forge-429`'s
  or `forge-login`'s line straight into its parent's stdout through `/proc/<ppid>/fd/1`,
  then kills its parent; the agent itself prints nothing forged.

`HOSTILE_PROVIDER=rate-limited` (the environment, not the prompt) stands for a provider that
really limits the account: loopsweb's own request with it (LOOPSWEB_STEP_ID `check`,
ledger/services/accounts.py `account_request`) is answered with a 429, exit 1.

The mark command appends a line to `$HOSTILE_DIR/marks` and passes its input through (so a
filter using it would "work"): a mark file means loopsweb ran the agent's command.
"""

from __future__ import annotations

import json
import math
import os
import signal
import stat
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path


def _cases(argv: list[str]) -> set[str]:
    prompt = (
        argv[argv.index("--") + 1] if "--" in argv[:-1] else (argv[-1] if argv else "")
    )
    for word in prompt.replace("\n", " ").split():
        if word.startswith("HOSTILE_CASES="):
            return set(word.split("=", 1)[1].split(","))
    return set()


def _mark_command(hostile: Path) -> str:
    script = hostile / "mark.sh"
    if not script.exists():
        script.write_text(
            "#!/bin/sh\n"
            f'echo "ran by $(id -un) in $(pwd): $0 $*" >> {hostile / "marks"}\n'
            "cat\n"
        )
        script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(script)


def _git(*args: str) -> None:
    # The agent's own git: plain, in its working directory, as an attacker would run it.
    subprocess.run(["git", *args], check=True, capture_output=True)


def _main_git_dir() -> Path:
    text = Path(".git").read_text()
    return Path(text.removeprefix("gitdir:").strip()).parent.parent


def _own_repo(mark: str) -> None:
    Path(".git").unlink()
    _git("init", "-q", ".")
    _git("config", "core.fsmonitor", mark)
    _git("config", "core.hooksPath", str(Path(mark).parent / "hooks"))


def _shared_config(mark: str) -> None:
    hooks = Path(mark).parent / "hooks"
    hooks.mkdir(exist_ok=True)
    for name in ("pre-commit", "post-commit", "post-checkout", "reference-transaction"):
        (hooks / name).write_text(f"#!/bin/sh\nexec {mark} hook-{name} </dev/null\n")
        (hooks / name).chmod(0o755)
    for key, value in (
        ("core.fsmonitor", mark),
        ("core.hooksPath", str(hooks)),
        ("filter.evil.clean", mark),
        ("filter.evil.smudge", mark),
        ("filter.evil.required", "true"),
        ("diff.external", mark),
        ("diff.evil.textconv", mark),
        ("core.pager", mark),
        ("core.sshCommand", mark),
    ):
        _git("config", key, value)
    Path(".gitattributes").write_text("* filter=evil diff=evil\n")


def _push_config(mark: str) -> None:
    decoy = os.environ["HOSTILE_DECOY_URL"]
    origin = subprocess.run(
        ["git", "config", "--get", "remote.origin.url"], capture_output=True, text=True
    ).stdout.strip()
    hooks = Path(mark).parent / "hooks"
    hooks.mkdir(exist_ok=True)
    own_hooks = _main_git_dir() / "hooks"
    for where in (hooks, own_hooks):
        where.mkdir(parents=True, exist_ok=True)
        (where / "pre-push").write_text(f"#!/bin/sh\nexec {mark} hook-pre-push\n")
        (where / "pre-push").chmod(0o755)
    for key, value in (
        ("remote.origin.url", decoy),
        ("remote.origin.pushurl", decoy),
        ("credential.helper", f"!{mark} credential"),
        ("core.sshCommand", mark),
        ("core.hooksPath", str(hooks)),
    ):
        _git("config", key, value)
    if origin:
        _git("config", f"url.{decoy}.insteadOf", origin)
        _git("config", f"url.{decoy}.pushInsteadOf", origin)


def _setsid(hostile: Path) -> None:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with (hostile / "pids").open("a") as out:
                out.write(f"{os.getpid()}\n")
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            time.sleep(600)
        os._exit(0)
    os.wait()
    # The daemon has written its pid before the step ends.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (hostile / "pids").exists():
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    if argv[:1] == [TOOL]:
        return _tool(argv[1])
    step = os.environ.get("LOOPSWEB_STEP_ID", "step")
    Path(f"agent-work-{step}.txt").write_text(f"work of step {step}\n")
    print(f"HOSTILE_AGENT step={step} cwd={os.getcwd()}", flush=True)
    if step == "check" and os.environ.get("HOSTILE_PROVIDER") == "rate-limited":
        print(FORGED["forge-429"], flush=True)
        return 1
    cases = _cases(argv)
    if "forge-usage-huge" in cases:
        _result(9 * 10**18, 2**63 - 1, math.inf)
    if step != "worker":
        return 0
    hostile = Path(os.environ["HOSTILE_DIR"])
    hostile.mkdir(parents=True, exist_ok=True)
    mark = _mark_command(hostile)
    if "setsid" in cases:
        _setsid(hostile)
    if "shared-config" in cases:
        _shared_config(mark)
    if "push-config" in cases:
        _push_config(mark)
    if "main-gitdir" in cases:
        Path(".git").write_text(f"gitdir: {_main_git_dir()}\n")
    if "no-dotgit" in cases:
        Path(".git").unlink()
    if "own-repo" in cases:
        _own_repo(mark)
    _windows(cases)
    if "forge-usage" in cases:
        _result(300_000, 100_000, 42.5)
        _result(0, 0, 0.0)
    print(f"HOSTILE_AGENT did {sorted(cases)}", flush=True)
    injected = sorted(case for case in cases if case in INJECTED)
    if injected:
        return _injected(injected[0])
    return _forged(cases)


FORGED = {
    "forge-429": "HTTP 429 Too Many Requests: try again in 168 hours",
    "forge-login": "Not logged in \u00b7 Please run /login",
}


def _forged(cases: set[str]) -> int:
    """What the forging cases print about the account (the CLI's own words); 1 when one did."""
    said = [FORGED[case] for case in sorted(cases) if case in FORGED]
    for line in said:
        print(line, flush=True)
    return 1 if said else 0


# 9999-12-31T00:00:00Z, the latest day a provider could name.
FORGED_RESET = 253402214400
FORGED_NAMES = 550
TOOL = "--hostile-tool"
INJECTED = {"inject-429": "forge-429", "inject-login": "forge-login"}


def _print_json(event: dict[str, object]) -> None:
    """One JSON line as the CLIs print it (compact)."""
    print(json.dumps(event, separators=(",", ":")), flush=True)


def _result(input_tokens: int, output_tokens: int, cost: float) -> None:
    """A claude `result` line (agents/usage.py reads its usage and cost)."""
    _print_json(
        {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "result": "done",
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
            "total_cost_usd": cost,
        }
    )


def _window_event(name: str, **info: object) -> str:
    """One claude `rate_limit_event` line (agents/window_parse.py reads it)."""
    return json.dumps(
        {
            "type": "rate_limit_event",
            "rate_limit_info": {"rateLimitType": name, **info},
        },
        separators=(",", ":"),
    )


def _windows(cases: set[str]) -> None:
    """`forge-windows` and `forge-names` as the provider the agent runs as prints them."""
    provider = os.environ.get("LOOPSWEB_PROVIDER")
    lines: list[str] = []
    if "forge-windows" in cases and provider == "claude":
        lines.append(
            _window_event("five_hour", status="rejected", resetsAt=FORGED_RESET)
        )
        lines.append(
            _window_event(
                "seven_day",
                status="allowed_warning",
                utilization=0.5,
                resetsAt=FORGED_RESET,
            )
        )
    if "forge-windows" in cases and provider == "codex":
        _codex_rollout()
    if "forge-names" in cases and provider == "claude":
        # Each name a tenth used (so each would be a gauge on /metrics), all in one write.
        lines += [
            _window_event(f"w{n:04d}", utilization=0.1) for n in range(FORGED_NAMES)
        ]
    if lines:
        sys.stdout.write("".join(f"{line}\n" for line in lines))
        sys.stdout.flush()


def _codex_rollout() -> None:
    """A rollout file of the agent's own in `$CODEX_HOME/sessions/YYYY/MM/DD/`, whose
    `token_count` line says what no provider sent, and the `thread.started` line that
    names it (runs/window_watch.py reads both)."""
    thread = str(uuid.uuid4())
    now = datetime.now(UTC)
    day = Path(os.environ["CODEX_HOME"]) / "sessions" / now.strftime("%Y/%m/%d")
    day.mkdir(parents=True, exist_ok=True)
    limits = {
        "primary": {"used_percent": 100.0, "window_minutes": 300},
        "secondary": {"used_percent": 50.0, "window_minutes": 10080},
    }
    for entry in limits.values():
        entry["resets_at"] = FORGED_RESET
    line = {
        "type": "event_msg",
        "payload": {"type": "token_count", "rate_limits": limits},
    }
    name = f"rollout-{now.strftime('%Y-%m-%dT%H-%M-%S')}-{thread}.jsonl"
    (day / name).write_text(json.dumps(line) + "\n")
    _print_json({"type": "thread.started", "thread_id": thread})


def _injected(case: str) -> int:
    """Run the tool that forges `case` into this process's stdout; it kills this process,
    so returning (0, nothing forged) means the injection did not happen."""
    subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), TOOL, case],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    return 0


def _tool(case: str) -> int:
    """The tool: the forged line into the parent's stdout, then the parent killed (a
    CLI that died on its own failure)."""
    parent = os.getppid()
    with open(f"/proc/{parent}/fd/1", "a") as out:
        out.write(FORGED[INJECTED[case]] + "\n")
    os.kill(parent, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
