"""The real agent CLIs for tests: installed once from the npm registry, and account homes.

`install_clis()` installs the pinned versions (`CLI_PACKAGES`) with `npm install --prefix`
into a cache directory named after the pins (`LOOPSWEB_CLI_CACHE_DIR`, default
`~/.cache/loopsweb/cli-contract`), once; later calls find the binaries there. Where `npm`
is absent the caller's test is skipped with the reason printed. (tests/ledger/
test_cli_contract.py and tests/agents/ share this one mechanism.)

Account homes the CLIs accept, pointed at a provider stand-in (tests/agents/provider.py),
the key read from an environment variable the account's env file sets:
- codex: `CODEX_HOME/config.toml` with a `model_providers` entry (`env_key`);
- claude: a `CLAUDE_CONFIG_DIR` plus `ANTHROPIC_BASE_URL` and `ANTHROPIC_API_KEY`;
- opencode: its four XDG directories under one home, a provider in
  `config/opencode/opencode.json` whose `apiKey` is `{env:NAME}`.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

# provider -> (npm package, pinned version, binary name)
CLI_PACKAGES = {
    "codex": ("@openai/codex", "0.171.0", "codex"),
    "claude": ("@anthropic-ai/claude-code", "2.1.197", "claude"),
    "opencode": ("opencode-ai", "1.18.33", "opencode"),
}
STUB_MODEL = "stub-model"
REAL_CLIS = tuple(CLI_PACKAGES)


def on_each_cli(*rows: tuple[Any, ...] | str) -> list[Any]:
    """Parameters of a real-CLI test: each row (a provider, or a provider and more values) runs
    on SQLite; only codex's rows run on PostgreSQL too. What a CLI does (its flags, its output,
    its 429) is the same over either database, and what the ledger records of it is one code
    path for every CLI, so the PostgreSQL suite proves the ledger side once, with the CLI that
    costs the least CPU (opencode costs about 5 s of CPU a run on the 2-core machine).

    It does so through the processes (`drain`, the run cluster, `run_workflow`: test_runs_real,
    test_windows_processes, test_login_failed_real, test_failure_paths_real, test_hostile_real,
    test_delivery_real). The modules that run the runner in the test's own process with the
    real CLIs (test_runner_real, test_windows_real) are SQLite only: on PostgreSQL the same
    ledger paths (a cooldown and a pool move, an idle limit, a login mark, output flushed while
    a step runs, a window recorded) are the fake agent's (tests/ledger/test_failover.py,
    test_runner.py, test_runner_limits.py, test_login_failed.py, test_windows.py)."""
    params = []
    for row in rows:
        values = _values(row)
        marks = () if values[0] == "codex" else (pytest.mark.sqlite,)
        params.append(pytest.param(*values, marks=marks))
    return params


def _values(row: tuple[Any, ...] | str) -> tuple[Any, ...]:
    """A parameter row as its values: a provider alone, or a provider and more values."""
    return (row,) if isinstance(row, str) else row


def through_the_ledger(*rows: tuple[Any, ...] | str) -> list[Any]:
    """Parameters of a test whose subject is what loopsweb does with a CLI's outcome (a drain,
    a cluster, a pool move, a login mark, a cooldown), not what the CLI does: `on_each_cli`
    without opencode's rows. opencode costs about 3.5 s of CPU a run, seven times codex or
    claude, and what it does is proven where it is the subject: its flags, output, 401, 429
    and hang (tests/agents/test_real_clis.py, tests/ledger/test_cli_contract.py, the hang and
    login tests of tests/agents/test_runner_real.py), its 429 moving a step
    (tests/agents/test_windows_real.py) and its whole run through the processes
    (tests/agents/test_runs_real.py)."""
    return on_each_cli(*(row for row in rows if _values(row)[0] != "opencode"))


def cache_dir() -> Path:
    pins = ",".join(f"{p}@{v}" for p, v, _ in CLI_PACKAGES.values())
    base = os.environ.get("LOOPSWEB_CLI_CACHE_DIR") or str(
        Path.home() / ".cache" / "loopsweb" / "cli-contract"
    )
    return Path(base) / hashlib.sha256(pins.encode()).hexdigest()[:12]


def install_clis(who: str) -> Path:
    """The `node_modules/.bin` holding the pinned CLIs (installed on first use); skips the
    calling test, printing why, where npm is absent."""
    npm = shutil.which("npm")
    if npm is None:
        reason = "npm is not installed: the agent CLIs cannot be fetched from the npm registry"
        print(f"SKIPPED {who}: {reason}")
        pytest.skip(reason)
    prefix = cache_dir()
    bin_dir = prefix / "node_modules" / ".bin"
    prefix.mkdir(parents=True, exist_ok=True)
    # xdist workers install side by side: one installs, the others wait for it and find it.
    with open(prefix / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all((bin_dir / name).exists() for _, _, name in CLI_PACKAGES.values()):
            _npm_install(npm, prefix)
    return bin_dir


def _npm_install(npm: str, prefix: Path) -> None:
    print(f"installing {len(CLI_PACKAGES)} agent CLIs from npm into {prefix} ...")
    done = subprocess.run(
        [
            npm,
            "install",
            "--prefix",
            str(prefix),
            "--no-audit",
            "--no-fund",
            "--loglevel",
            "error",
            *(f"{package}@{version}" for package, version, _ in CLI_PACKAGES.values()),
        ],
        cwd=prefix,  # never the checkout, like every process a test starts
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"npm install failed:\n{done.stderr[-4000:]}"


def write_env_file(path: Path, values: dict[str, str]) -> Path:
    """A 0600 env file of NAME=value lines (what `account add --env-file` takes)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.writelines(f"{name}={value}\n" for name, value in values.items())
    os.chmod(path, 0o600)
    return path


def codex_home(directory: Path, base_url: str, key_variable: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.toml").write_text(
        f'model = "{STUB_MODEL}"\n'
        'model_provider = "stub"\n'
        'approval_policy = "never"\n'
        # Update checks and analytics: the adapter turns them off (-c).
        "[model_providers.stub]\n"
        'name = "Local stand-in"\n'
        f'base_url = "{base_url}/v1"\n'
        f'env_key = "{key_variable}"\n'
        'wire_api = "responses"\n'
        # codex's workspace-write sandbox makes /tmp and $TMPDIR writable and, to keep a `.git`
        # read-only under each writable root, creates an empty /tmp/.git directory while it
        # runs: every path under /tmp then reads as inside a git work tree (a test asserting
        # "outside any work tree" failed on it). The suite's codex runs write their worktree
        # only.
        "[sandbox_workspace_write]\n"
        "exclude_slash_tmp = true\n"
        "exclude_tmpdir_env_var = true\n"
    )
    return directory


def claude_config_dir(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def claude_oauth_login(directory: Path, token: str) -> Path:
    """A claude.ai-style login in `directory` (scope `user:inference`, not expiring)."""
    path = directory / ".credentials.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(
            {
                "claudeAiOauth": {
                    "accessToken": token,
                    "refreshToken": f"{token}-refresh",
                    "expiresAt": 4102444800000,
                    "scopes": ["user:inference"],
                    "subscriptionType": "max",
                }
            },
            handle,
        )
    return path


def opencode_home(directory: Path, base_url: str, key_variable: str) -> Path:
    config = directory / "config" / "opencode"
    config.mkdir(parents=True, exist_ok=True)
    (config / "opencode.json").write_text(
        json.dumps(
            {
                "model": f"stub/{STUB_MODEL}",
                "small_model": f"stub/{STUB_MODEL}",
                "autoupdate": False,
                "share": "disabled",
                "provider": {
                    "stub": {
                        "npm": "@ai-sdk/openai-compatible",
                        "name": "Local stand-in",
                        "options": {
                            "baseURL": f"{base_url}/v1",
                            "apiKey": f"{{env:{key_variable}}}",
                        },
                        "models": {
                            STUB_MODEL: {
                                "name": "Stand-in model",
                                "limit": {"context": 128000, "output": 8192},
                            }
                        },
                    }
                },
            }
        )
    )
    return directory


def git_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


KEY_VARIABLE = "STANDIN_API_KEY"


def register_account(
    provider: str,
    name: str,
    stand_in: Any,
    directory: Path,
    *,
    key: str | None,
    env_key: str = KEY_VARIABLE,
    oauth: bool = False,
) -> None:
    """`manage.py account add NAME` (in this process) for `provider`, its login directory
    pointing at the stand-in and its key in a 0600 env file; `key` None: no login at all.
    claude with `oauth`: a subscription-style login instead (`.credentials.json` in its
    config directory holding `key` as the OAuth access token), the login for which claude
    reports its rate-limit window (docs/windows.md §1)."""
    from django.core.management import call_command

    home = directory / f"{name}-home"
    argv = ["account", "add", name, "--provider", provider]
    env: dict[str, str] = {}
    if provider == "codex":
        codex_home(home, stand_in.url, env_key)
        # codex runs its commands in a login shell, which would read the dotfiles of the
        # user running the suite (a version manager's `init` there once left a stale lock
        # that made every later login shell on the machine wait 60 s): the account's own
        # HOME, as a host with one user per account would have.
        argv += ["--codex-home", str(home), "--env", f"HOME={home}"]
    elif provider == "claude":
        claude_config_dir(home)
        argv += ["--claude-config-dir", str(home), "--env"]
        argv.append(f"ANTHROPIC_BASE_URL={stand_in.url}")
        env_key = "ANTHROPIC_API_KEY"
        if oauth and key:
            claude_oauth_login(home, key)
            key = None
    else:
        opencode_home(home, stand_in.url, env_key)
        argv += ["--opencode-home", str(home)]
    if key:
        env[env_key] = key
        argv += ["--env-file", str(write_env_file(directory / f"{name}.env", env))]
    call_command(*argv, stdout=io.StringIO())
