"""`account add` with login directories and an env file (agents.envfile): the path is
stored, the key never is; a file that is not 0600 or not ours is refused, also when it is
swapped while it is read; an error never quotes a line; a file over the limit is refused."""

from __future__ import annotations

import json
import os
import secrets
import threading
from collections import Counter
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from agents.envfile import MAX_BYTES, EnvFileError, read_env_file
from ledger.models import Account
from ledger.selectors import account_gate, account_registry
from runs.providers import ProviderError, account_environment
from tests.agents.clis import write_env_file

SECRET = "sk-test-" + "9" * 24


def _table_text() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM accounts")
        return json.dumps(cursor.fetchall(), default=str)


@pytest.mark.django_db
def test_an_env_file_readable_by_others_is_refused_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    path = write_env_file(tmp_path / "acct.env", {"OPENAI_API_KEY": SECRET})
    os.chmod(path, 0o644)
    with pytest.raises(CommandError, match=r"mode 0644.*must be 0600"):
        call_command(
            "account", "add", "acct-a", "--provider", "codex", "--env-file", str(path)
        )
    assert not Account.objects.exists()
    assert SECRET not in _table_text()


@pytest.mark.django_db
def test_the_database_holds_the_env_files_path_never_its_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_env_file(tmp_path / "acct.env", {"OPENAI_API_KEY": SECRET})
    call_command(
        "account",
        "add",
        "acct-a",
        "--provider",
        "codex",
        "--codex-home",
        str(tmp_path / "codex"),
        "--env-file",
        str(path),
        "--json",
    )
    printed = capsys.readouterr().out
    row = Account.objects.get()
    assert row.env_file == str(path)
    assert row.env_json == {"CODEX_HOME": str(tmp_path / "codex")}
    assert SECRET not in _table_text()
    assert SECRET not in printed
    call_command("account", "list", "--json")
    assert SECRET not in capsys.readouterr().out
    # Read when the step starts: through the registry row and through the gate's row.
    assert account_environment("acct-a")["OPENAI_API_KEY"] == SECRET
    gate = account_gate("acct-a", now=row.created_at)
    assert gate.account is not None and gate.account.env_file == str(path)
    # Loosened after registration: the step's start refuses it.
    os.chmod(path, 0o640)
    with pytest.raises(ProviderError, match="account acct-a: env file .* 0640"):
        account_environment("acct-a", registry=account_registry(["acct-a"]))


@pytest.mark.django_db
def test_opencode_home_sets_the_four_xdg_directories_and_other_providers_refuse_it(
    tmp_path: Path,
) -> None:
    home = tmp_path / "oc"
    call_command(
        "account", "add", "oc-a", "--provider", "opencode", "--opencode-home", str(home)
    )
    assert Account.objects.get().env_json == {
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "XDG_STATE_HOME": str(home / "state"),
    }
    with pytest.raises(CommandError, match="--codex-home is for codex accounts"):
        call_command(
            "account", "add", "x", "--provider", "claude", "--codex-home", str(home)
        )
    with pytest.raises(CommandError, match="must be an absolute path"):
        call_command(
            "account", "add", "y", "--provider", "claude", "--claude-config-dir", "rel"
        )
    assert Account.objects.count() == 1


def test_read_env_file_parses_name_value_lines(tmp_path: Path) -> None:
    path = tmp_path / "e.env"
    path.write_text(
        "# comment\n\nexport A=1\nB='two words'\nC=\"x=y\"\nD=\n E = spaced\n"
    )
    os.chmod(path, 0o600)
    assert read_env_file(str(path)) == {
        "A": "1",
        "B": "two words",
        "C": "x=y",
        "D": "",
        "E": " spaced",
    }


@pytest.mark.parametrize(
    ("content", "mode", "message"),
    [
        ("A=1\n", 0o604, "mode 0604"),
        ("A=1\n", 0o700, "mode 0700"),
        ("not a pair\n", 0o600, "line 1: not NAME=value"),
        ("1A=x\n", 0o600, "line 1: the text before '=' is not a variable name"),
        ("LOOPSWEB_X=1\n", 0o600, "loopsweb's own"),
        ("SECRET_KEY=1\n", 0o600, "loopsweb's own"),
    ],
)
def test_read_env_file_refuses_with_an_error_that_never_shows_a_value(
    tmp_path: Path, content: str, mode: int, message: str
) -> None:
    path = tmp_path / "e.env"
    path.write_text(content)
    os.chmod(path, mode)
    with pytest.raises(EnvFileError, match=message) as caught:
        read_env_file(str(path))
    assert "=1" not in str(caught.value)


def test_read_env_file_refuses_relative_missing_and_symlinked_paths(
    tmp_path: Path,
) -> None:
    with pytest.raises(EnvFileError, match="absolute path"):
        read_env_file("relative.env")
    with pytest.raises(EnvFileError, match="cannot be read"):
        read_env_file(str(tmp_path / "missing.env"))
    target = write_env_file(tmp_path / "real.env", {"A": "1"})
    link = tmp_path / "link.env"
    link.symlink_to(target)
    with pytest.raises(EnvFileError, match="not a regular file"):
        read_env_file(str(link))


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file away")
def test_read_env_file_refuses_a_file_owned_by_another_user(tmp_path: Path) -> None:
    path = write_env_file(tmp_path / "theirs.env", {"A": "1"})
    os.chown(path, 65534, 65534)
    with pytest.raises(EnvFileError, match="owned by uid 65534"):
        read_env_file(str(path))


def _key() -> str:
    return "sk-ant-api03-" + secrets.token_urlsafe(32)


@pytest.mark.parametrize(
    ("line", "number", "what"),
    [
        ("{key}", 2, "not NAME=value"),
        ("ANTHROPIC_API_KEY: {key}", 2, "not NAME=value"),
        ("export {key}", 2, "not NAME=value"),
        ("{key}=", 2, "the text before '=' is not a variable name"),
        ("{key}==", 2, "the text before '=' is not a variable name"),
        ("ANTHROPIC API KEY={key}", 2, "the text before '=' is not a variable name"),
        ("export {key}=x", 2, "the text before '=' is not a variable name"),
        ("LOOPSWEB_KEY={key}", 2, "LOOPSWEB_KEY is loopsweb's own"),
        ("ANTHROPIC_API_KEY={key}\x00", 2, "the value of ANTHROPIC_API_KEY has a NUL"),
    ],
)
def test_an_env_file_error_names_the_file_and_line_never_the_lines_text(
    tmp_path: Path, line: str, number: int, what: str
) -> None:
    key = _key()
    path = tmp_path / "acct.env"
    path.write_text("# the account's key\n" + line.format(key=key) + "\n")
    os.chmod(path, 0o600)
    with pytest.raises(EnvFileError) as caught:
        read_env_file(str(path))
    message = str(caught.value)
    assert message.startswith(f"env file {path}, line {number}: "), message
    assert what in message
    # Not the key, nor any long piece of it.
    assert key not in message and key[:16] not in message and key[-16:] not in message


def test_an_env_file_over_the_limit_is_refused_never_cut(tmp_path: Path) -> None:
    path = tmp_path / "big.env"
    filler = "# " + "x" * 1021 + "\n"  # 1 KiB lines
    body = filler * (MAX_BYTES // len(filler))
    path.write_text(body + "A=1\n")
    os.chmod(path, 0o600)
    assert len(body) == MAX_BYTES
    with pytest.raises(EnvFileError) as caught:
        read_env_file(str(path))
    assert str(caught.value) == (
        f"env file {path} is larger than {MAX_BYTES} bytes, the most an env file may "
        "hold; it is refused, never cut"
    )
    # At the limit, it is read to its end.
    path.write_text(body[: -len(filler)] + "A=1\n")
    assert read_env_file(str(path)) == {"A": "1"}


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    path = tmp_path / "fifo.env"
    os.mkfifo(path, 0o600)
    with pytest.raises(EnvFileError, match="is not a regular file"):
        read_env_file(str(path))


READS = 50_000  # about a second of CPU; the unfixed reader leaked 2-14 times in as many


def test_a_path_swapped_between_a_0600_and_a_0644_file_never_yields_the_0644_content(
    tmp_path: Path,
) -> None:
    """A thread flips the path between a 0600 file and a 0644 one (each keeps its mode,
    so the 0644 content is only ever in a 0644 file) while this thread reads it: a read
    returns the 0600 content or refuses with the 0644 mode, never the 0644 content (the
    file checked is the file read: one open, fstat on that descriptor)."""
    private = write_env_file(tmp_path / "private", {"A": "private-value"})
    exposed = write_env_file(tmp_path / "exposed", {"A": "exposed-value"})
    os.chmod(exposed, 0o644)
    path = tmp_path / "acct.env"
    os.link(private, path)
    stop = threading.Event()

    def flip() -> None:
        n = 0
        while not stop.is_set():
            staged = tmp_path / f"staged-{n % 2}"
            os.link(exposed if n % 2 == 0 else private, staged)
            os.replace(staged, path)  # atomic: the path always names one of the two
            n += 1

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    seen: Counter[str] = Counter()
    try:
        for _ in range(READS):
            try:
                seen[read_env_file(str(path))["A"]] += 1
            except EnvFileError as exc:
                assert "has mode 0644" in str(exc), exc
                seen["refused"] += 1
    finally:
        stop.set()
        flipper.join(timeout=60)
    assert seen["exposed-value"] == 0, seen
    # Both files were there to be read.
    assert seen["private-value"] > 0 and seen["refused"] > 0, seen
