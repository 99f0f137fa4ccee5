"""The agent CLIs loopsweb runs, as tables: every provider a route may name (`PROVIDERS`) and
how each CLI is called (`ADAPTERS`: its leading argv, how an account reaches it, the
variable where it keeps its login, the variables every step of it gets). runs.providers
builds a step's argv and environment from them; the admin, its filters and `manage.py
account` read them. Standard library only."""

from __future__ import annotations

from dataclasses import dataclass

# Every provider a route may name (`--provider`), in the order messages and filters list them.
PROVIDERS = ("codewith", "claude", "codex", "cursor", "opencode", "aicopilot")


@dataclass(frozen=True)
class Adapter:
    """How one provider's CLI is called.

    - `leading`: argv after the binary (subcommand, print mode, machine-readable output);
    - `profile_flag` / `profile_env`: how an account NAME reaches a CLI that takes one;
    - `account_variable`: the variable the CLI reads to find its login, which a registered
      account's environment sets (documentation and `account add` hints).
    """

    provider: str
    leading: tuple[str, ...]
    sandbox_flag: str | None = None
    profile_flag: str | None = None
    profile_env: str | None = None
    prompt_file_flag: str | None = None
    account_variable: str | None = None
    # Variables every step of this provider gets (module docstring, "headless").
    fixed_env: tuple[tuple[str, str], ...] = ()


ADAPTERS: dict[str, Adapter] = {
    "codewith": Adapter(
        "codewith",
        ("exec",),
        sandbox_flag="--sandbox",
        profile_flag="--profile",
        profile_env="CODEWITH_PROFILE",
    ),
    # `codex exec --help`: "--json  Print events to stdout as JSONL"; the login lives in
    # CODEX_HOME (`-p/--profile` is a config profile, not a login).
    "codex": Adapter(
        "codex",
        ("exec", "--json"),
        sandbox_flag="--sandbox",
        account_variable="CODEX_HOME",
    ),
    # `claude --help`: -p/--print, --output-format stream-json (needs --verbose; the last
    # line is the result object with usage and total_cost_usd), --permission-mode; one
    # login per configuration directory, CLAUDE_CONFIG_DIR.
    "claude": Adapter(
        "claude",
        ("--print", "--output-format", "stream-json", "--verbose"),
        account_variable="CLAUDE_CONFIG_DIR",
        fixed_env=(
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
            ("DISABLE_TELEMETRY", "1"),
            ("DISABLE_AUTOUPDATER", "1"),
            ("DISABLE_ERROR_REPORTING", "1"),
        ),
    ),
    # cursor-agent is not published on npm (the npm package of that name is unrelated);
    # it keeps its login under the user's home directory.
    "cursor": Adapter("cursor", ("--print",), account_variable="HOME"),
    # opencode keeps credentials in $XDG_DATA_HOME/opencode/auth.json and its config in
    # $XDG_CONFIG_HOME/opencode/opencode.json (`account add --opencode-home` sets all four
    # XDG directories). `opencode run --help`: --format json, --print-logs, --log-level.
    "opencode": Adapter(
        "opencode",
        # --title: opencode then makes no model call to title the session (docstring).
        (
            "run",
            "--format",
            "json",
            "--print-logs",
            "--log-level",
            "WARN",
            "--title",
            "loopsweb",
        ),
        account_variable="XDG_DATA_HOME",
        fixed_env=(
            ("OPENCODE_DISABLE_AUTOUPDATE", "1"),
            ("OPENCODE_DISABLE_MODELS_FETCH", "1"),
        ),
    ),
    "aicopilot": Adapter(
        "aicopilot",
        (),
        profile_env="AICOPILOT_PROFILE",
        prompt_file_flag="--prompt-file",
    ),
}
