"""No secret in the ledger (agents.redaction): the redaction function, the secrets an
invocation carries, and the step watch that applies them to what a step printed."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from agents.redaction import MIN_LENGTH, Redactor, looks_secret
from ledger.selectors import RegisteredAccount
from runs.agent_step import StepWatch
from runs.processes import ProcessResult
from runs.providers import agent_invocation, command_invocation
from tests.agents.clis import write_env_file


def _key() -> str:
    return "sk-ant-api03-" + secrets.token_urlsafe(32)


def test_each_value_is_replaced_by_its_name_longest_first() -> None:
    short, long = "sk-abc-12345678", "sk-abc-12345678-and-more"
    redactor = Redactor({"SHORT": short, "LONG": long})
    text = f"a {long} b {short}c\n{short}"
    assert redactor.redact(text) == (
        "a [redacted:LONG] b [redacted:SHORT]c\n[redacted:SHORT]"
    )
    assert redactor.redact("nothing here") == "nothing here"
    assert redactor.redact("") == ""
    assert redactor.redact_optional(None) is None


def test_values_too_short_to_be_a_key_are_left_as_they_are() -> None:
    redactor = Redactor({"A": "1", "B": "x" * (MIN_LENGTH - 1), "C": "y" * MIN_LENGTH})
    text = f"1 {'x' * (MIN_LENGTH - 1)} {'y' * MIN_LENGTH}"
    assert redactor.redact(text) == f"1 {'x' * (MIN_LENGTH - 1)} [redacted:C]"
    assert not Redactor({"A": "short"}) and not Redactor()


def test_a_value_as_json_escapes_it_is_caught_too() -> None:
    value = 'pa"ss\\word-123'
    redactor = Redactor({"DB_PASSWORD": value})
    printed = json.dumps({"error": f"bad password {value}"})
    assert value not in json.loads(redactor.redact(printed))["error"]
    assert json.loads(redactor.redact(printed)) == {
        "error": "bad password [redacted:DB_PASSWORD]"
    }


def test_the_step_secrets_are_the_env_files_values_and_secret_looking_names() -> None:
    key, token = _key(), "ghp_" + "t" * 30
    redactor = Redactor.for_environment(
        {"ANTHROPIC_API_KEY": key, "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"},
        {
            "GITHUB_TOKEN": token,
            "HOME": "/home/someone",
            "ANTHROPIC_API_KEY": key,
        },
    )
    assert redactor.redact(f"{key} {token} /home/someone http://127.0.0.1:9") == (
        "[redacted:ANTHROPIC_API_KEY] [redacted:GITHUB_TOKEN] /home/someone "
        "[redacted:ANTHROPIC_BASE_URL]"
    )
    assert key not in repr(redactor) and token not in repr(redactor)
    for name in ("OPENAI_API_KEY", "api_key", "GH_TOKEN", "DB_PASSWORD", "MY_SECRET"):
        assert looks_secret(name), name
    for name in ("HOME", "PATH", "CODEX_HOME", "LANG"):
        assert not looks_secret(name), name


def test_an_agent_invocation_carries_its_env_files_values_as_secrets(
    tmp_path: Path, settings: Any
) -> None:
    key = _key()
    env_file = write_env_file(tmp_path / "k.env", {"ANTHROPIC_API_KEY": key})
    settings.LOOPSWEB_PROVIDER_BINARIES = {"claude": "/bin/true"}
    account = RegisteredAccount(
        name="k1",
        provider="claude",
        enabled=True,
        max_running=None,
        env={"CLAUDE_CONFIG_DIR": str(tmp_path)},
        env_file=str(env_file),
    )
    invocation = agent_invocation(
        target={"provider": "claude", "prompt": "go", "cwd": str(tmp_path)},
        profile="k1",
        tool="claude",
        run_id="run-1",
        step_id="worker",
        registry={"k1": account},
    )
    assert invocation.env["ANTHROPIC_API_KEY"] == key  # the agent gets its key
    assert invocation.secrets.redact(f"invalid x-api-key {key}") == (
        "invalid x-api-key [redacted:ANTHROPIC_API_KEY]"
    )
    assert key not in repr(invocation)
    command = command_invocation(
        target={"command": "true", "env": {"DEPLOY_TOKEN": "tok-" + "z" * 20}},
        run_id="run-1",
        step_id="deploy",
    )
    assert command.secrets.redact("tok-" + "z" * 20) == "[redacted:DEPLOY_TOKEN]"


def test_the_watch_redacts_the_result_the_flushes_and_the_live_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = _key()
    redactor = Redactor({"ANTHROPIC_API_KEY": key})
    written: list[dict[str, Any]] = []
    monkeypatch.setattr(
        "ledger.services.step_output_record", lambda **kw: written.append(kw) or True
    )
    watch = StepWatch("step-1", "claude", is_agent=True, secrets=redactor)
    watch.flush(f"out {key}", f"err {key}")
    watch.keep(f"kept {key}", "")
    seen: list[str] = []
    monkeypatch.setattr(
        "runs.agent_step.live_rate_limit",
        lambda provider, stdout, stderr, now: seen.extend([stdout, stderr]),
    )
    watch.stop_when(f"live {key}", f"live {key}")
    result = watch.redacted(
        ProcessResult(
            pid=1,
            exit_code=1,
            signal_name=None,
            stdout=f"invalid x-api-key {key}",
            stderr=f"401 {key}",
            duration_ms=5,
            spawn_error=f"cannot start {key}",
        )
    )
    texts = [
        *(kw[name] for kw in written for name in ("stdout", "stderr")),
        *seen,
        result.stdout,
        result.stderr,
        result.spawn_error,
    ]
    assert all(key not in text for text in texts), texts
    assert result.stdout == "invalid x-api-key [redacted:ANTHROPIC_API_KEY]"
    assert written[0]["stdout"] == "out [redacted:ANTHROPIC_API_KEY]"
