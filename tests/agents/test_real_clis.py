"""The real codex, claude and opencode CLIs (pinned, from npm) against the provider stand-in.

Each test registers an account with `manage.py account add` (its login directory and an env
file holding its key), builds the step's argv and environment with the adapter
(`runs.providers.agent_invocation`), runs the CLI in a temporary git repository and reads
its output with `agents.agent_output` / `agents.usage`. One test per CLI per behaviour;
each ends by itself because the adapter bounds the CLIs' own retries. The tests assert what
happened and in which order, never how long it took: how soon a 429 is detected and the step
moves is the failover benchmark's figure (tests/bench/bench_failover.py, make bench). A
refused login's own message is proven through the runner, which reads the same output
(tests/agents/test_runner_real.py).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from pytest_django import Settings

from agents.agent_message import final_message
from agents.agent_output import (
    agent_error,
    live_rate_limit,
    rate_limit,
    summarize_output,
)
from agents.usage import parse_usage
from runs.providers import agent_invocation
from tests.agents import clis
from tests.agents.provider import ProviderStandIn
from tests.agents.running import Finished, run_agent
from tests.waiting import hang_deadline

# SQLite only, codex's rows too (the exception to `clis.on_each_cli`): the subject is what
# each CLI does, the same over either database, and the database here only registers the
# accounts. What the ledger does with these outcomes runs on PostgreSQL through the runner
# and the processes (test_runner_real.py, test_login_failed_real.py, test_runs_real.py).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db,
    pytest.mark.sqlite,
    pytest.mark.xdist_group("agent_clis"),
]

PROVIDERS = clis.on_each_cli(*clis.REAL_CLIS)
KEY_VARIABLE = "STANDIN_API_KEY"
PROMPT = "Write the file agent-output.txt in the working directory."
# The Retry-After in the 429 test: the runner stops each CLI as soon as its output names the
# limit, before this reset and so before the CLI's own retry; far enough away that only a
# stuck run reaches it (scaled like every hang deadline).
RESET_SECONDS = round(hang_deadline(120))


def _at(stamp: float) -> datetime:
    return datetime.fromtimestamp(stamp, UTC)


def _register(
    provider: str,
    name: str,
    stand_in: ProviderStandIn,
    tmp_path: Path,
    *,
    key: str | None,
) -> None:
    """`account add NAME` for `provider` pointing at the stand-in; `key` None: no login."""
    home = tmp_path / f"{name}-home"
    argv = ["account", "add", name, "--provider", provider]
    env: dict[str, str] = {}
    if provider == "codex":
        clis.codex_home(home, stand_in.url, KEY_VARIABLE)
        argv += ["--codex-home", str(home)]
        if key:
            env[KEY_VARIABLE] = key
    elif provider == "claude":
        clis.claude_config_dir(home)
        argv += [
            "--claude-config-dir",
            str(home),
            "--env",
            f"ANTHROPIC_BASE_URL={stand_in.url}",
        ]
        if key:
            env["ANTHROPIC_API_KEY"] = key
    else:
        clis.opencode_home(home, stand_in.url, KEY_VARIABLE)
        argv += ["--opencode-home", str(home)]
        if key:
            env[KEY_VARIABLE] = key
    if env:
        path = clis.write_env_file(tmp_path / f"{name}.env", env)
        argv += ["--env-file", str(path)]
    call_command(*argv)


def _run(
    provider: str,
    name: str,
    cli_bin: Path,
    tmp_path: Path,
    settings: Settings,
    *,
    stop_when: Callable[[str, str], bool] | None = None,
) -> tuple[Finished, Path]:
    settings.LOOPSWEB_PROVIDER_BINARIES = {
        provider: str(cli_bin / clis.CLI_PACKAGES[provider][2])
    }
    repo = clis.git_repo(tmp_path / f"{name}-repo")
    invocation = agent_invocation(
        target={
            "provider": provider,
            "prompt": PROMPT,
            "sandbox": "workspace-write",
            "cwd": str(repo),
        },
        profile=name,
        tool=provider,
        run_id="run-1",
        step_id="worker",
    )
    return run_agent(invocation, stop_when=stop_when), repo


# opencode's: tests/agents/test_runs_real.py (its whole run through the processes checks the
# same file, keys, usage and summary; an opencode run costs about 5 s of CPU).
@pytest.mark.parametrize("provider", clis.on_each_cli("codex", "claude"))
def test_the_real_cli_writes_the_file_with_the_accounts_key_and_reports_its_usage(
    provider: str,
    cli_bin: Path,
    stand_in: ProviderStandIn,
    tmp_path: Path,
    settings: Settings,
) -> None:
    _register(provider, "acct-a", stand_in, tmp_path, key="key-of-acct-a")
    done, repo = _run(provider, "acct-a", cli_bin, tmp_path, settings)
    assert done.exit_code == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert (repo / stand_in.file_name).read_text() == stand_in.file_content
    # Every model call carried the account's key (from its env file), nothing else.
    assert stand_in.keys_seen() == {"key-of-acct-a"}
    assert stand_in.model_calls()
    usage = parse_usage(provider, done.stdout)
    reported = stand_in.reported("key-of-acct-a")
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens, usage.cached_tokens) == (
        reported["input_tokens"],
        reported["output_tokens"],
        reported["cached_tokens"],
    )
    if provider == "claude":
        assert usage.cost_usd is not None and usage.cost_usd > 0
    assert agent_error(provider, done.stdout, done.stderr, done.exit_code) is None
    live = summarize_output(provider, done.stdout)
    assert stand_in.file_name in live  # the tool call / command, readable
    assert stand_in.final_text in live  # the final message
    # ... and the agent's own words, as the pull request quotes them (agents.agent_message)
    assert final_message(provider, done.stdout) == stand_in.final_text


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_429_in_the_clis_real_format_is_detected_before_its_reset_with_its_reset_time(
    provider: str,
    cli_bin: Path,
    stand_in: ProviderStandIn,
    tmp_path: Path,
    settings: Settings,
) -> None:
    """Each CLI names the 429 in its live output before it waits for its next try (codex's
    `Reconnecting... 429` event, claude's `api_retry` event, opencode's log), and is
    stopped there, before the reset the provider named: no try of the CLI waits it out.
    (claude waits a short Retry-After, printing `api_retry` first, and gives up at once on a
    long one like this test's; the failover benchmark measures it at 30 s.)"""
    stand_in.mode = "429"
    stand_in.retry_after = RESET_SECONDS
    _register(provider, "acct-a", stand_in, tmp_path, key="key-of-acct-a")
    started = datetime.now(UTC)

    def limited(stdout: str, stderr: str) -> bool:
        return (
            live_rate_limit(provider, stdout, stderr, now=datetime.now(UTC)) is not None
        )

    done, repo = _run(
        provider, "acct-a", cli_bin, tmp_path, settings, stop_when=limited
    )
    assert not done.timed_out, (done.stdout[-2000:], done.stderr[-2000:])
    assert not (repo / stand_in.file_name).exists()
    now = datetime.now(UTC)
    posts = [r for r in stand_in.requests if r.method == "POST"]
    assert posts and {r.mode for r in posts} == {"429"}
    if done.stopped:
        signal = live_rate_limit(provider, done.stdout, done.stderr, now=now)
    else:
        # claude does not wait a Retry-After this long at all: it gives up at once.
        assert provider == "claude" and done.exit_code == 1, done.exit_code
        signal = rate_limit(
            provider,
            done.stdout,
            done.stderr,
            done.exit_code,
            rate_limit_exit_codes=(),
            now=now,
        )
    first_429 = min(r.at for r in posts)
    assert done.ended_at < first_429 + stand_in.retry_after
    assert all(r.at < first_429 + stand_in.retry_after for r in posts)
    assert signal is not None, (done.stdout[-2000:], done.stderr[-2000:])
    if provider == "codex":
        # codex prints `last status: 429 Too Many Requests` and no reset time: the
        # account cools for the backoff (docs/agents.md).
        assert "429 Too Many Requests" in signal.snippet
        assert signal.until is None
    else:
        # claude names its wait before the next try (the provider's Retry-After), opencode
        # the response headers and message: the reset is the provider's.
        assert signal.until is not None
        expected = started + timedelta(seconds=stand_in.retry_after)
        assert expected - timedelta(seconds=5) <= signal.until
        assert signal.until <= now + timedelta(seconds=stand_in.retry_after + 1)
    # The bounded retries: the CLI gave up (or was stopped) after a few tries.
    assert 1 <= len(posts) <= 8


def test_account_check_says_what_is_wrong(
    cli_bin: Path,
    stand_in: ProviderStandIn,
    tmp_path: Path,
    settings: Settings,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from django.core.management.base import CommandError

    settings.LOOPSWEB_PROVIDER_BINARIES = {
        p: str(cli_bin / clis.CLI_PACKAGES[p][2]) for p in clis.REAL_CLIS
    }
    _register("claude", "claude-nologin", stand_in, tmp_path, key=None)
    with pytest.raises(CommandError, match="not logged in"):
        call_command("account", "check", "claude-nologin")
    assert "2.1.197 (Claude Code)" in capsys.readouterr().out
    _register("claude", "claude-key", stand_in, tmp_path, key="k")
    call_command("account", "check", "claude-key")
    assert "logged in (api_key)" in capsys.readouterr().out
    _register("codex", "codex-key", stand_in, tmp_path, key="k")
    call_command("account", "check", "codex-key")
    assert f"reads its key from {KEY_VARIABLE}, which is set" in capsys.readouterr().out
    _register("opencode", "opencode-nokey", stand_in, tmp_path, key=None)
    with pytest.raises(CommandError, match=f"reads {KEY_VARIABLE}, which is not set"):
        call_command("account", "check", "opencode-nokey")


def test_codex_on_a_subscriptions_usage_limit_names_the_reset_clock_time(
    cli_bin: Path, stand_in: ProviderStandIn, tmp_path: Path, settings: Settings
) -> None:
    # What ChatGPT's backend answers a subscription at its usage limit; codex prints
    # "... or try again at 4:24 AM." (its clock time, the machine's time zone).
    stand_in.mode = "429"
    stand_in.usage_limit_seconds = 1800
    _register("codex", "acct-a", stand_in, tmp_path, key="key-of-acct-a")
    done, _ = _run("codex", "acct-a", cli_bin, tmp_path, settings)
    # codex gave up by itself instead of waiting for the reset.
    assert done.exit_code == 1
    first_429 = min(r.at for r in stand_in.requests if r.mode == "429")
    assert done.ended_at < first_429 + stand_in.usage_limit_seconds
    error = agent_error("codex", done.stdout, done.stderr, done.exit_code)
    assert error is not None and "usage limit" in error and "try again at" in error
    now = datetime.now(UTC)
    signal = rate_limit(
        "codex", done.stdout, done.stderr, 1, rate_limit_exit_codes=(), now=now
    )
    assert signal is not None and signal.until is not None
    # Printed to the minute: within a minute of the reset the provider named, which was
    # between its first 429 and the end of the run plus 1800 s.
    reset = timedelta(seconds=stand_in.usage_limit_seconds)
    minute = timedelta(seconds=60)
    assert _at(first_429) + reset - minute <= signal.until
    assert signal.until <= _at(done.ended_at) + reset + minute
