"""Provider adapters: argv and environment for agent steps (docs/design.md, "no shell between
loopsweb and an agent").

Every adapter turns an agent step into an argv list run with `shell=False`. The prompt, and
so every value that came from an event, is ONE argv item after `--` (so a prompt that starts
with `-` is never read as a flag), or, for providers that read a file, a 0600 file in a 0700
temporary directory that the runner deletes after the step.

Binaries come from `settings.LOOPSWEB_PROVIDER_BINARIES` (env `LOOPSWEB_<PROVIDER>_BIN`): a
name looked up on PATH or an absolute path.

How the account reaches the agent (the step's recorded `account_profile`, so the account the
ledger counts is the login the agent uses). A REGISTERED account (`manage.py account add`)
brings its own environment (`account_environment`), for example
`CODEX_HOME=/srv/agents/acctA/codex`: that variable is what the CLI reads to find its login;
and, for an API-key login, its env file (`Account.env_file`, read when the step starts by
`agents.envfile.read_env_file`: 0600, owned by the worker's user, or the step fails).
The env file's values, and the step environment's variables whose names look secret, travel
on the `Invocation` as `secrets`: the runner redacts them from the step's output and error
before it stores them (agents.redaction).
An unregistered name only reaches codewith (`--profile`) and aicopilot
(`AICOPILOT_PROFILE`); the other CLIs then use the worker's own login.

| provider  | argv                                                        | selects the login        |
|-----------|-------------------------------------------------------------|--------------------------|
| codewith  | `codewith exec --sandbox S [--profile P] -- PROMPT`         | `--profile P` (+ `CODEWITH_PROFILE`) |
| codex     | `codex exec --json --sandbox S [--skip-git-repo-check] -c ... -- PROMPT` | `CODEX_HOME` (registry) |
| claude    | `claude --print --output-format stream-json --verbose --permission-mode M -- PROMPT` | `CLAUDE_CONFIG_DIR` (registry) |
| cursor    | `cursor-agent --print -- PROMPT`                            | `HOME` (registry; not on npm, unverified) |
| opencode  | `opencode run --format json --print-logs --log-level WARN --title loopsweb -- PROMPT` | `XDG_*_HOME` (registry) |
| aicopilot | `aicopilot --prompt-file FILE`                              | `AICOPILOT_PROFILE`      |

What each real CLI needs to work headless (measured against the pinned versions, see
docs/agents.md and tests/agents/):
- codex: `--skip-git-repo-check` when the cwd is not inside a git work tree (codex refuses to
  start there otherwise). Its retries are bounded with `-c
  model_providers.ID.stream_max_retries=N` and `...request_max_retries=N`, where ID is the
  custom provider the account's `$CODEX_HOME/config.toml` selects (`model_provider`); codex
  refuses overrides of its built-in providers (`openai`, ...), which keep their own retries.
  Update checks and analytics are config, turned off for every step with `-c
  check_for_update_on_startup=false -c analytics.enabled=false`.
- claude: print mode edits nothing without a permission mode, so the sandbox picks one:
  `read-only` -> `plan`, `workspace-write` (and no sandbox) -> `acceptEdits`,
  `danger-full-access` -> `bypassPermissions`. stream-json prints one JSON line per message
  (live output); the last line is the same `result` object `--output-format json` prints.
  Env: `CLAUDE_CODE_MAX_RETRIES=N`, and telemetry, error reporting, the auto-updater and
  other non-essential traffic off.
- opencode: `--format json` events on stdout; `--print-logs` puts its log on stderr, which
  names a failed model call (a 429) within seconds while the JSON stream says nothing until
  its own retries (about 150 s, no setting bounds them) run out, so the runner watches
  stderr (`agents.agent_output.live_rate_limit`). Permissions through `OPENCODE_PERMISSION`
  by sandbox (`read-only`: edit and bash denied; otherwise allowed); auto-update and the
  models.dev fetch off. `--title` names the session, so opencode makes no model call to
  title it: the step's first request is its own, and a 429 on it is in the log at once (a
  title call sent first had its 429 retried without a word, seconds before the step's).
N is `settings.LOOPSWEB_AGENT_MAX_RETRIES` (default 1: one retry, so a rate limit reaches
loopsweb in seconds and the step moves to another account).

Every agent also gets `LOOPSWEB_ACCOUNT_PROFILE`, `LOOPSWEB_ACCOUNT_TOOL`, `LOOPSWEB_RUN_ID`
and `LOOPSWEB_STEP_ID`.

The child environment is built from an allowlist, never from the worker's whole environment
(cloud keys, SSH agent sockets and loopsweb's own settings stay with the worker):
1. from the worker: `PATH`, `HOME`, the locale (`LANG`, `LANGUAGE`, `LC_*`), and the names
   (or `PREFIX*` patterns) listed in `LOOPSWEB_AGENT_ENV_PASSTHROUGH`;
2. the account's own variables (`account_environment`), which select its login, then the
   variables of its env file;
3. the provider's fixed variables (telemetry and update checks off, bounded retries,
   opencode's permissions);
4. what loopsweb sets: `LOOPSWEB_ACCOUNT_*`, `LOOPSWEB_RUN_ID`, `LOOPSWEB_STEP_ID`,
   `LOOPSWEB_PROVIDER` and the provider's profile variable; a command step's own `env`.
Later entries win. loopsweb's settings (`LOOPSWEB_*` other than the ones it sets,
`DATABASE_URL`, `SECRET_KEY`, `DJANGO_SETTINGS_MODULE`) never pass, whatever a pattern says.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from agents.envfile import EnvFileError, read_env_file, reserved_variable
from agents.providers import ADAPTERS, Adapter
from agents.redaction import Redactor
from domain.errors import ApplicationError
from domain.pool import valid_profile_name
from ledger.selectors import RegisteredAccount, account_registry

PROVIDER_UNKNOWN = "unknown agent provider: {provider}"
BINARY_NOT_FOUND = (
    "agent binary not found for provider {provider}: {binary} (set {env_var})"
)
PROMPT_MISSING = "agent step has no prompt"
PROMPT_NUL = "agent prompt contains a NUL byte"
PROFILE_INVALID = "auth profile is not a valid name: {profile!r}"
ACCOUNT_WRONG_PROVIDER = (
    "account {profile} is registered for provider {registered}, not {provider}"
)
CWD_MISSING = "working directory does not exist: {cwd}"
AGENT_CWD_NONE = "agent step has no working directory (target.cwd)"
COMMAND_MISSING = "command step has no command"
COMMAND_INVALID = "command step arguments must be strings"
ENV_INVALID = "step env must map names to strings"

# Inherited from the worker's environment (module docstring, "from the worker").
_INHERIT_NAMES = frozenset({"PATH", "HOME", "LANG", "LANGUAGE"})
_INHERIT_PREFIXES = ("LC_",)
# Never inherited, whatever LOOPSWEB_AGENT_ENV_PASSTHROUGH says: `reserved_variable`.


class ProviderError(ApplicationError):
    """An agent or command step that cannot be started as written."""


@dataclass
class Invocation:
    """What the runner executes: argv (never through a shell), cwd, env, files to delete,
    and the secrets to redact from its output (agents.redaction)."""

    argv: list[str]
    cwd: str | None
    env: dict[str, str] = field(repr=False)  # holds the account's key: never in a repr
    cleanup: list[Path] = field(default_factory=list)
    provider: str | None = None
    # The step's secret values, redacted from what it prints before anything stores it.
    secrets: Redactor = field(default_factory=Redactor, repr=False)
    # The account's own variables (its login directories; runs.sandbox binds those).
    account_env: dict[str, str] = field(default_factory=dict, repr=False)
    # The step's sandbox (runs.sandbox.StepSandbox), when it runs in one.
    sandbox: Any = None

    def remove_files(self) -> None:
        for path in self.cleanup:
            shutil.rmtree(path, ignore_errors=True)


def _passes(name: str, passthrough: tuple[str, ...]) -> bool:
    if reserved_variable(name):
        return False
    if name in _INHERIT_NAMES or name.startswith(_INHERIT_PREFIXES):
        return True
    for entry in passthrough:
        if entry.endswith("*"):
            if name.startswith(entry[:-1]):
                return True
        elif name == entry:
            return True
    return False


def account_environment(
    profile: str | None,
    tool: str | None = None,
    *,
    registry: Mapping[str, RegisteredAccount] | None = None,
) -> dict[str, str]:
    """The account's own variables (its login), merged over the inherited ones.

    From the account registry (`manage.py account add NAME --codex-home DIR`, `--env
    KEY=VALUE`, ...): what selects the account's login for its provider's CLI
    (`CODEX_HOME`, `CLAUDE_CONFIG_DIR`, ...), then the variables of its env file
    (`--env-file`), read now; {} for an unregistered name. `registry` saves the query when
    the caller read the row. An env file that cannot be used raises ProviderError.
    """
    own, from_file = account_variables(profile, registry=registry)
    return {**own, **from_file}


def account_variables(
    profile: str | None, *, registry: Mapping[str, RegisteredAccount] | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """`account_environment` in two parts: (the account's registered variables, the
    variables of its env file); every value of the second is a secret (agents.redaction)."""
    if not profile:
        return {}, {}
    rows = registry if registry is not None else account_registry([profile])
    row = rows.get(profile)
    if row is None:
        return {}, {}
    env_file = getattr(row, "env_file", None)
    if not env_file:
        return dict(row.env), {}
    try:
        return dict(row.env), read_env_file(env_file)
    except EnvFileError as exc:
        raise ProviderError(f"account {profile}: {exc}") from None


def max_retries() -> int:
    """How often an agent CLI retries a failed model call (module docstring)."""
    value = getattr(settings, "LOOPSWEB_AGENT_MAX_RETRIES", 1)
    return value if isinstance(value, int) and value >= 0 else 1


def in_git_work_tree(path: str) -> bool:
    """True when `path` is inside a git work tree (a `.git` directory or file above it)."""
    current = os.path.realpath(path)
    while True:
        if os.path.exists(os.path.join(current, ".git")):
            return True
        parent = os.path.dirname(current)
        if parent == current:
            return False
        current = parent


def codex_custom_provider(codex_home: str | None) -> str | None:
    """The custom `model_provider` the account's `$CODEX_HOME/config.toml` selects (an id
    with its own `[model_providers.ID]` table), or None (built-in, unreadable, none)."""
    if not codex_home:
        return None
    try:
        with open(os.path.join(codex_home, "config.toml"), "rb") as handle:
            config = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError):
        return None
    name = config.get("model_provider")
    providers = config.get("model_providers")
    if (
        isinstance(name, str)
        and isinstance(providers, dict)
        and isinstance(providers.get(name), dict)
        and _TOML_BARE_KEY.match(name)
    ):
        return name
    return None


_TOML_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
CLAUDE_PERMISSION_MODES = {
    "read-only": "plan",
    "workspace-write": "acceptEdits",
    "danger-full-access": "bypassPermissions",
}
OPENCODE_PERMISSIONS = {
    "read-only": '{"edit":"deny","bash":"deny","webfetch":"deny"}',
    "workspace-write": '{"edit":"allow","bash":"allow","webfetch":"deny"}',
    "danger-full-access": '{"edit":"allow","bash":"allow","webfetch":"allow"}',
}


def headless_options(
    provider: str, *, sandbox: str | None, cwd: str, account_env: Mapping[str, str]
) -> tuple[list[str], dict[str, str]]:
    """The argv items (after the adapter's own) and variables a provider's CLI needs to do
    its work headless and fail fast (module docstring)."""
    adapter = ADAPTERS[provider]
    args: list[str] = []
    env = dict(adapter.fixed_env)
    retries = str(max_retries())
    mode = sandbox if sandbox in CLAUDE_PERMISSION_MODES else "workspace-write"
    if provider == "codex":
        if not in_git_work_tree(cwd):
            args.append("--skip-git-repo-check")
        args += ["-c", "check_for_update_on_startup=false"]
        args += ["-c", "analytics.enabled=false"]
        custom = codex_custom_provider(account_env.get("CODEX_HOME"))
        if custom:
            for knob in ("stream_max_retries", "request_max_retries"):
                args += ["-c", f"model_providers.{custom}.{knob}={retries}"]
    elif provider == "claude":
        args += ["--permission-mode", CLAUDE_PERMISSION_MODES[mode]]
        env["CLAUDE_CODE_MAX_RETRIES"] = retries
    elif provider == "opencode":
        env["OPENCODE_PERMISSION"] = OPENCODE_PERMISSIONS[mode]
    return args, env


def child_environment(
    extra: Mapping[str, str] | None = None,
    *,
    account_env: Mapping[str, str] | None = None,
    provider_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of an agent or command: the allowlist (module docstring), then the
    account's variables, the provider's fixed ones, then `extra` (what loopsweb sets for
    the step)."""
    passthrough = tuple(settings.LOOPSWEB_AGENT_ENV_PASSTHROUGH)
    env = {
        name: value for name, value in os.environ.items() if _passes(name, passthrough)
    }
    if account_env:
        env.update(account_env)
    if provider_env:
        env.update(provider_env)
    if extra:
        env.update(extra)
    return env


def _binary(provider: str) -> str:
    configured = settings.LOOPSWEB_PROVIDER_BINARIES.get(provider) or provider
    found = shutil.which(configured)
    if found is None:
        raise ProviderError(
            BINARY_NOT_FOUND.format(
                provider=provider,
                binary=configured,
                env_var=f"LOOPSWEB_{provider.upper()}_BIN",
            )
        )
    # Absolute: the process starts in the step's cwd, where a relative path would not resolve.
    return os.path.abspath(found)


def agent_binary(provider: str) -> str:
    """The absolute path of `provider`'s CLI (settings), or ProviderError saying what to set."""
    return _binary(provider)


def _check_cwd(cwd: Any) -> str | None:
    if cwd is None or cwd == "":
        return None
    if not isinstance(cwd, str) or not os.path.isdir(cwd):
        raise ProviderError(CWD_MISSING.format(cwd=cwd))
    return cwd


def agent_invocation(
    *,
    target: Mapping[str, Any],
    profile: str | None,
    tool: str | None,
    run_id: str,
    step_id: str,
    registry: Mapping[str, RegisteredAccount] | None = None,
) -> Invocation:
    """argv/env/cwd for an agent step (target `{type: agent, provider, prompt, cwd, …}`).

    `registry` (the profile's registry row as the step start read it, {} when it has none)
    saves reading it again."""
    provider = str(target.get("provider") or "")
    adapter, prompt = _adapter_and_prompt(provider, target)
    registry = _profile_registry(provider, profile, registry)
    cwd = _check_cwd(target.get("cwd"))
    if cwd is None:
        # Never the worker's own directory (loopsweb's source tree or data).
        raise ProviderError(AGENT_CWD_NONE)
    argv = [_binary(provider), *adapter.leading]
    sandbox = target.get("sandbox")
    if adapter.sandbox_flag and isinstance(sandbox, str) and sandbox:
        argv += [adapter.sandbox_flag, sandbox]
    if adapter.profile_flag and profile:
        argv += [adapter.profile_flag, profile]
    own_env, file_env = account_variables(profile, registry=registry)
    account_env = {**own_env, **file_env}
    headless_args, provider_env = headless_options(
        provider,
        sandbox=sandbox if isinstance(sandbox, str) else None,
        cwd=cwd,
        account_env=account_env,
    )
    argv += headless_args
    env_extra = _step_variables(
        adapter,
        provider,
        cwd,
        run_id=run_id,
        step_id=step_id,
        profile=profile,
        tool=tool,
    )
    prompt_args, cleanup = _prompt_arguments(adapter, prompt)
    argv += prompt_args
    env = child_environment(
        env_extra, account_env=account_env, provider_env=provider_env
    )
    return Invocation(
        argv=argv,
        cwd=cwd,
        env=env,
        cleanup=cleanup,
        provider=provider,
        secrets=Redactor.for_environment(file_env, env),
        account_env=account_env,
    )


def _adapter_and_prompt(
    provider: str, target: Mapping[str, Any]
) -> tuple[Adapter, str]:
    """The provider's adapter and the step's prompt, or ProviderError saying what is wrong."""
    adapter = ADAPTERS.get(provider)
    if adapter is None:
        raise ProviderError(PROVIDER_UNKNOWN.format(provider=provider or "(none)"))
    prompt = target.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ProviderError(PROMPT_MISSING)
    if "\x00" in prompt:
        raise ProviderError(PROMPT_NUL)
    return adapter, prompt


def _profile_registry(
    provider: str,
    profile: str | None,
    registry: Mapping[str, RegisteredAccount] | None,
) -> Mapping[str, RegisteredAccount]:
    """The profile's registry row (read when not given), checked against the provider."""
    if profile is not None and not valid_profile_name(profile):
        raise ProviderError(PROFILE_INVALID.format(profile=profile))
    if registry is None:
        registry = account_registry([profile]) if profile else {}
    account = registry.get(profile) if profile else None
    if account is not None and account.provider != provider:
        raise ProviderError(
            ACCOUNT_WRONG_PROVIDER.format(
                profile=profile, registered=account.provider, provider=provider
            )
        )
    return registry


def _step_variables(
    adapter: Adapter,
    provider: str,
    cwd: str,
    *,
    run_id: str,
    step_id: str,
    profile: str | None,
    tool: str | None,
) -> dict[str, str]:
    """The variables loopsweb gives an agent step's process (before its account's)."""
    env_extra = {
        "LOOPSWEB_RUN_ID": run_id,
        "LOOPSWEB_STEP_ID": step_id,
        "LOOPSWEB_PROVIDER": provider,
        # opencode takes its project from $PWD before its working directory: with the
        # cluster's PWD (a passthrough naming it, an account's env file) it worked and wrote
        # in the cluster's directory, outside the run (measured, docs/agents.md).
        "PWD": os.path.abspath(cwd),
    }
    if profile:
        env_extra["LOOPSWEB_ACCOUNT_PROFILE"] = profile
        if adapter.profile_env:
            env_extra[adapter.profile_env] = profile
    if tool:
        env_extra["LOOPSWEB_ACCOUNT_TOOL"] = tool
    return env_extra


def _prompt_arguments(adapter: Adapter, prompt: str) -> tuple[list[str], list[Path]]:
    """The prompt's arguments (in a private file when the CLI reads it from one) and what
    to remove after the step."""
    if not adapter.prompt_file_flag:
        return ["--", prompt], []
    directory = Path(tempfile.mkdtemp(prefix="loopsweb-prompt-"))  # mode 0700
    path = directory / "prompt.txt"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(prompt)
    return [adapter.prompt_file_flag, str(path)], [directory]


def command_invocation(
    *, target: Mapping[str, Any], run_id: str, step_id: str
) -> Invocation:
    """argv/env/cwd for a command step of a hand-written workflow.

    `{command, args, cwd, env, shell}`: argv `[command, *args]`. Only `shell: true`, which
    a hand-written workflow must ask for, runs `command` through `/bin/sh -c`; generated
    route workflows never contain command steps, so no event text reaches a shell.
    """
    command = target.get("command")
    if not isinstance(command, str) or not command:
        raise ProviderError(COMMAND_MISSING)
    args = target.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ProviderError(COMMAND_INVALID)
    env = target.get("env") or {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ProviderError(ENV_INVALID)
    if any("\x00" in part for part in [command, *args]):
        raise ProviderError(COMMAND_INVALID)
    cwd = _check_cwd(target.get("cwd"))
    if target.get("shell") is True:
        argv = ["/bin/sh", "-c", command, *args]
    else:
        argv = [command, *args]
    child = child_environment(
        {"LOOPSWEB_RUN_ID": run_id, "LOOPSWEB_STEP_ID": step_id, **env}
    )
    return Invocation(
        argv=argv, cwd=cwd, env=child, secrets=Redactor.for_environment({}, child)
    )


def rate_limit_exit_codes(provider: str | None) -> frozenset[int]:
    codes = settings.LOOPSWEB_RATE_LIMIT_EXIT_CODES.get(provider or "", frozenset())
    return frozenset(codes)
