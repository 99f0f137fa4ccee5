"""The account self-test (`manage.py account check`) and the smallest real request a step
would make, run with the account's environment on this host.

1. `account_self_test` runs the CLI's cheapest self-test: `--version`, then a login probe
   (codex `login status`, or the variable its custom provider's `env_key` names; claude
   `auth status`; opencode `auth list`, or the variables its configured providers read),
   then, when those pass, the smallest real request: the headless invocation a step would
   get (runs.providers.agent_invocation) with a one-line prompt in a throwaway directory,
   which must be answered (exit 0); and says what is wrong; what it prints has the
   account's secrets redacted (agents.redaction: its env file's values, variables whose
   names look secret).
2. The request decides the account's `login failed` mark (ledger.services.cooldowns): an
   answer clears it; an authentication error (agents.ratelimit.detect_login_failure) sets
   it with the agent's words, as a step's would.
3. `account_request` is that request alone: runs.confirm asks it to confirm a long cooldown
   an agent's output claimed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field

from agents.agent_output import agent_error, strip_ansi
from agents.envfile import EnvFileError, read_env_file
from agents.providers import ADAPTERS
from agents.ratelimit import detect_login_failure
from agents.redaction import Redactor
from ledger.held_secrets import held_secrets
from ledger.models import Account
from ledger.services.accounts import ACCOUNT_NOT_FOUND, AccountError
from ledger.services.cooldowns import account_clear, account_login_failed_record
from runs.processes import Limits, run_process
from runs.providers import (
    Invocation,
    ProviderError,
    agent_binary,
    agent_invocation,
    child_environment,
    headless_options,
)
from runs.sandbox import sandbox_on, sandbox_problem, step_sandbox

CHECK_TIMEOUT_SECONDS = 60
# The real request: opencode alone spends about 6 s starting, a model call a few more.
REQUEST_TIMEOUT_SECONDS = 120
REQUEST_PROMPT = "Reply with the single word ok. Do not run any tool or edit any file."


@dataclass
class SelfTest:
    """What `account check` found: `ok` when nothing is wrong; `lines` says what was run."""

    name: str
    provider: str
    ok: bool = True
    lines: list[str] = field(default_factory=list)
    # What the CLI prints may echo the account's key: redacted (agents.redaction).
    secrets: Redactor = field(default_factory=Redactor, repr=False)

    @property
    def problems(self) -> list[str]:
        return [line for line in self.lines if line.startswith("PROBLEM: ")]

    def problem(self, text: str) -> None:
        self.ok = False
        self.lines.append(f"PROBLEM: {self.secrets.redact(text)}")

    def fine(self, text: str) -> None:
        self.lines.append(f"ok: {self.secrets.redact(text)}")


def _run_both(
    argv: list[str],
    env: Mapping[str, str],
    cwd: str,
    timeout: float = CHECK_TIMEOUT_SECONDS,
) -> tuple[int | None, str, str]:
    """(exit code, stdout, stderr); no exit code and the reason in stderr when it did not
    end by itself."""
    try:
        done = subprocess.run(
            argv,
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None, "", f"no answer in {timeout:g} s"
    except OSError as exc:
        return None, "", str(exc)
    return done.returncode, done.stdout, done.stderr


def _run(
    argv: list[str], env: Mapping[str, str], cwd: str
) -> tuple[int | None, str, str]:
    """(exit code, the output on one line, stdout as printed)."""
    code, stdout, stderr = _run_both(argv, env, cwd)
    text = strip_ansi(f"{stdout}\n{stderr}")
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.startswith("WARNING: proceeding")
    ]
    return code, " / ".join(lines)[:500], stdout


def _codex_login(test: SelfTest, binary: str, env: Mapping[str, str], cwd: str) -> None:
    home = env.get("CODEX_HOME")
    if home and not os.path.isdir(home):
        test.problem(f"CODEX_HOME {home} does not exist")
        return
    config: dict[str, object] = {}
    if home:
        try:
            with open(os.path.join(home, "config.toml"), "rb") as handle:
                config = tomllib.load(handle)
        except FileNotFoundError:
            pass
        except (OSError, tomllib.TOMLDecodeError) as exc:
            test.problem(f"{home}/config.toml cannot be read: {exc}")
            return
    name = config.get("model_provider")
    providers = config.get("model_providers")
    entry = providers.get(name) if isinstance(providers, dict) and name else None
    if isinstance(entry, dict) and entry.get("env_key"):
        key = str(entry["env_key"])
        if env.get(key):
            test.fine(f"provider {name} reads its key from {key}, which is set")
        else:
            test.problem(
                f"provider {name} reads its key from {key}, which is not set "
                "(put it in the account's --env-file)"
            )
        return
    code, text, _ = _run([binary, "login", "status"], env, cwd)
    if code == 0:
        test.fine(f"codex login status: {text}")
    elif env.get("OPENAI_API_KEY") or env.get("CODEX_API_KEY"):
        test.fine("an API key is set in the environment")
    else:
        test.problem(f"codex login status: {text}")


def _claude_login(
    test: SelfTest, binary: str, env: Mapping[str, str], cwd: str
) -> None:
    code, text, raw = _run([binary, "auth", "status"], env, cwd)
    try:
        status = json.loads(raw)
    except ValueError:
        status = None
    if isinstance(status, dict) and status.get("loggedIn"):
        test.fine(f"claude auth status: logged in ({status.get('authMethod')})")
    elif isinstance(status, dict):
        test.problem(
            "claude auth status: not logged in (run `claude /login` with this "
            "CLAUDE_CONFIG_DIR, or put ANTHROPIC_API_KEY in the account's --env-file)"
        )
    else:
        test.problem(f"claude auth status (exit {code}): {text}")


_ENV_REF = re.compile(r"\{env:([A-Za-z_][A-Za-z0-9_]*)\}")


def _opencode_login(
    test: SelfTest, binary: str, env: Mapping[str, str], cwd: str
) -> None:
    config_home = env.get("XDG_CONFIG_HOME") or os.path.join(
        env.get("HOME", ""), ".config"
    )
    path = os.path.join(config_home, "opencode", "opencode.json")
    try:
        with open(path, encoding="utf-8") as handle:
            config_text = handle.read()
    except OSError:
        config_text = ""
    missing = sorted({n for n in _ENV_REF.findall(config_text) if not env.get(n)})
    if missing:
        test.problem(f"{path} reads {', '.join(missing)}, which is not set")
        return
    code, text, _ = _run([binary, "auth", "list"], env, cwd)
    if code != 0:
        test.problem(f"opencode auth list (exit {code}): {text}")
    elif _ENV_REF.search(config_text):
        test.fine(f"{path} configures a provider whose key variables are set")
    elif re.search(r"\b0 credentials\b", text):
        test.problem(f"opencode auth list: no credentials ({text})")
    else:
        test.fine(f"opencode auth list: {text}")


_LOGIN_PROBES = {
    "codex": _codex_login,
    "claude": _claude_login,
    "opencode": _opencode_login,
}


def account_self_test(*, name: str) -> SelfTest:
    """`--version`, then the login probe, with the environment a step would get (module
    docstring, `account_self_test`)."""
    row = Account.objects.filter(pk=name.strip()).first()
    if row is None:
        raise AccountError(ACCOUNT_NOT_FOUND.format(name=name))
    test = SelfTest(name=row.name, provider=row.provider)
    if not row.enabled:
        test.problem("the account is disabled (never assigned)")
    env = {str(k): str(v) for k, v in (row.env_json or {}).items()}
    file_env: dict[str, str] = {}
    if row.env_file:
        try:
            file_env = read_env_file(row.env_file)
            env.update(file_env)
            test.fine(f"env file {row.env_file} is readable (0600, yours)")
        except EnvFileError as exc:
            test.problem(str(exc))
    try:
        binary = agent_binary(row.provider)
    except ProviderError as exc:
        test.problem(str(exc))
        return test
    cwd = env.get("HOME") or os.path.expanduser("~")
    cwd = cwd if os.path.isdir(cwd) else "/"
    _, provider_env = (
        headless_options(row.provider, sandbox=None, cwd=cwd, account_env=env)
        if row.provider in ADAPTERS
        else ([], {})
    )
    child = child_environment(
        {"LOOPSWEB_ACCOUNT_PROFILE": row.name},
        account_env=env,
        provider_env=provider_env,
    )
    test.secrets = Redactor.for_environment(file_env, child).with_secrets(
        held_secrets()
    )
    code, text, _ = _run([binary, "--version"], child, cwd)
    if code == 0:
        test.fine(f"{binary} --version: {text}")
    else:
        test.problem(f"{binary} --version (exit {code}): {text}")
        return test
    probe = _LOGIN_PROBES.get(row.provider)
    if probe is None:
        test.lines.append(f"note: {row.provider} has no login probe")
    else:
        probe(test, binary, child, cwd)
    if test.ok or (not row.enabled and len(test.problems) == 1):
        _real_request(test, row)
    return test


def _run_request(invocation: Invocation, cwd: str) -> tuple[int | None, str, str]:
    """The request as a step makes it: in the agent sandbox (runs.sandbox) unless the
    operator turned it off; ProviderError when the sandbox cannot run here."""
    if sandbox_on():
        problem = sandbox_problem()
        if problem is not None:
            raise ProviderError(problem)
        invocation.sandbox = step_sandbox(
            provider=invocation.provider or "",
            binary=invocation.argv[0],
            root=cwd,
            common_dir=None,
            account_env=invocation.account_env,
        )
    result = run_process(
        invocation=invocation,
        limits=Limits(
            timeout_seconds=REQUEST_TIMEOUT_SECONDS,
            tail_bytes=65536,
            grace_seconds=1.0,
            keep_alive_every=REQUEST_TIMEOUT_SECONDS,
        ),
    )
    if result.spawn_error:
        return None, "", result.spawn_error
    if result.timeout:
        return None, result.stdout, f"no answer in {REQUEST_TIMEOUT_SECONDS:g} s"
    return result.exit_code, result.stdout, result.stderr


def account_request(row: Account) -> tuple[int | None, str, str]:
    """The smallest request a step would make with the account, outside any task, in a
    throwaway directory and its own sandbox: (exit code, stdout, stderr); ProviderError when
    it cannot be made. `account check` makes it, and the confirmation of a claim about the
    account (runs.confirm)."""
    with tempfile.TemporaryDirectory(prefix="loopsweb-account-check-") as cwd:
        invocation = agent_invocation(
            target={
                "type": "agent",
                "provider": row.provider,
                "prompt": REQUEST_PROMPT,
                "cwd": cwd,
            },
            profile=row.name,
            tool=None,
            run_id="account-check",
            step_id="check",
        )
        argv = invocation.argv
        if row.provider == "codex" and "--skip-git-repo-check" not in argv:
            # The throwaway directory is no repository, whatever lies above it.
            argv.insert(argv.index("--"), "--skip-git-repo-check")
        try:
            return _run_request(invocation, cwd)
        finally:
            invocation.remove_files()


def _real_request(test: SelfTest, row: Account) -> None:
    """The smallest request a step would make, answered or not (module docstring,
    `account_self_test`: "the smallest real request")."""
    try:
        code, stdout, stderr = account_request(row)
    except ProviderError as exc:
        test.problem(str(exc))
        return
    if code == 0:
        test.fine("a real request was answered (exit 0)")
        # The provider's own answer outranks what a task printed about the account.
        cleared = account_clear(name=row.name)
        if cleared.anything:
            test.fine(f"cleared {cleared.text()}")
        return
    words = test.secrets.redact(
        agent_error(row.provider, stdout, stderr, code)
        or (f"exit code {code}" if code is not None else stderr)
    )
    refused = detect_login_failure(output=f"{stdout}\n{stderr}", exit_code=code)
    if refused is not None:
        account_login_failed_record(profile=row.name, reason=words)
        test.problem(f"the provider refused the login: {words} (marked login failed)")
    else:
        test.problem(f"a real request failed: {words}")
