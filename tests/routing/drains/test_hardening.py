"""Drains and commands under bad input and faults (issue 17): long values (#1), numeric
bounds (#2), the evidence directory (#6), JSON Lines read bounded (#10), scanExhausted (#11),
dry runs queue nothing and the fatal message names no missing file (#12)."""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django_q.models import OrmQ, Schedule

from routing.drains import drain_options, drain_run
from routing.drains.inbox import inbox_ingest
from routing.models import DrainRecord, InboxEvent
from routing.tasks import drain as drain_task
from tests.processes import own_sqlite_env, scratch_cwd
from tests.routing.api.helpers import row_counts
from tests.routing.helpers import generic_event

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[3]
LONG_PATH = "/srv/" + "p" * 6000


def ingest(*events: dict) -> None:
    inbox_ingest(enumerate(events, start=1))


def drain(kind: str = "generic", **raw):
    return drain_run(options=drain_options(kind, raw), env={})


# --- #1 long values -----------------------------------------------------------------------------


def test_an_event_that_can_never_route_is_marked_failed_once_not_retried_forever() -> (
    None
):
    ingest(generic_event(project=LONG_PATH), generic_event())
    first = drain(max_dispatch=5)
    assert first.counts["created"] == 1 and first.counts["fatal"] == 1
    bad = InboxEvent.objects.exclude(state="admitted").get()
    assert bad.state == "failed"
    assert "index entry holds at most" in (bad.last_reason or "")
    second = drain(max_dispatch=5)
    assert second.counts["considered"] == 0  # failed rows are not candidates again


def test_route_event_refuses_a_value_too_long_for_its_index_with_a_clear_error() -> (
    None
):
    before = row_counts()
    event = json.dumps(generic_event(project=LONG_PATH))
    with pytest.raises(CommandError, match="index entry holds at most 2600"):
        call_command(
            "route_event", "generic", "--event-json", event, stdout=io.StringIO()
        )
    assert row_counts() == before


# --- #2 numeric bounds ----------------------------------------------------------------------------

NINES = "9" * 5000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--scan-limit", "99999999999999999999"],
            "--scan-limit must be at most 10000000",
        ),
        (
            ["--source-timeout", "99999999999999999999"],
            "--source-timeout must be at most 86400",
        ),
        (["--max-dispatch", NINES], "--max-dispatch must be at most 100000"),
        (["--limit", "100001"], "--limit must be at most 100000"),
        (["--max-active", NINES], "--max-active must be at most 100000"),
        (["--max-per-profile", "100001"], "--max-per-profile must be at most 100000"),
        (["--max-active-per-project", "1" + "0" * 30], "must be at most 100000"),
    ],
)
def test_every_numeric_drain_option_has_an_upper_bound(args, message) -> None:
    ingest(generic_event())
    before = row_counts()
    with pytest.raises(CommandError, match=message):
        call_command("drain", "generic", *args, stdout=io.StringIO())
    assert row_counts() == before


@pytest.mark.parametrize(
    ("every", "message"),
    [
        ("99999999999999999999m", "--every must be at most 32767m"),
        ("32768m", "--every must be at most 32767m"),
        ("547h", "--every must be at most 32767m"),
        (NINES, "--every must be at most 32767m"),
    ],
)
def test_schedule_drain_every_has_an_upper_bound(every: str, message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command(
            "schedule_drain", "n1", "generic", "--every", every, stdout=io.StringIO()
        )
    assert not Schedule.objects.exists()


def test_schedule_drain_accepts_the_bound_itself() -> None:
    call_command(
        "schedule_drain", "n1", "generic", "--every", "546h", stdout=io.StringIO()
    )
    assert Schedule.objects.get(name="n1").minutes == 546 * 60


# --- #6 evidence directory ------------------------------------------------------------------------


def test_an_existing_evidence_directory_keeps_its_mode(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    ingest(generic_event())
    report = drain(evidence_dir=str(shared))
    assert report.evidence_path and not report.error
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert stat.S_IMODE(Path(report.evidence_path).stat().st_mode) == 0o600
    created = tmp_path / "new" / "evidence"
    drain(evidence_dir=str(created))
    assert stat.S_IMODE(created.stat().st_mode) == 0o700


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: _a_file(tmp), "is not a directory"),
        (lambda tmp: "/proc/loopsweb-evidence", "cannot be created"),
        (lambda tmp: _a_file(tmp) + "/below", "cannot be created"),
    ],
)
def test_a_bad_evidence_directory_is_refused_before_anything_is_admitted(
    tmp_path: Path, make, message: str
) -> None:
    ingest(generic_event(), generic_event())
    path = make(tmp_path)
    with pytest.raises(CommandError, match=message):
        call_command(
            "drain",
            "generic",
            "--max-dispatch",
            "5",
            "--evidence-dir",
            path,
            stdout=io.StringIO(),
        )
    assert not InboxEvent.objects.exclude(state="pending").exists()  # nothing admitted
    record = DrainRecord.objects.get()
    assert message in record.error and record.created == 0
    # From a schedule: the same refusal, recorded.
    result = drain_task(
        "generic", {"evidence_dir": path, "max_dispatch": 5}, name="nightly"
    )
    assert message in result["error"] and result["created"] == 0
    assert DrainRecord.objects.filter(name="nightly", error__contains=message).exists()
    assert not InboxEvent.objects.exclude(state="pending").exists()


def _a_file(tmp: Path) -> str:
    path = tmp / "a-file"
    path.write_text("x")
    return str(path)


# The drain's evidence check (`evidence_dir_prepare`), in a process of its own: exit 3 and
# the refusal's message when it refuses the directory.
_EVIDENCE_CHECK = (
    "import sys, django\n"
    "django.setup()\n"
    "from domain.errors import ValidationError\n"
    "from routing.drains.report import evidence_dir_prepare\n"
    "try:\n"
    "    evidence_dir_prepare(sys.argv[1])\n"
    "except ValidationError as exc:\n"
    "    print(exc)\n"
    "    sys.exit(3)\n"
    "print('writable')\n"
)
# How this machine can run a program that file modes bind, when the suite runs as root (as
# CI does): as nobody, or else as root without its capabilities (no CAP_DAC_OVERRIDE: the
# mode bits bind uid 0 too), where the interpreter is out of nobody's reach (under /root).
_UNPRIVILEGED = (
    ("runuser", "-u", "nobody", "--"),
    ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"),
    ("setpriv", "--inh-caps=-all", "--bounding-set=-all"),
)


def _evidence_check(prefix: tuple[str, ...], directory: Path) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.setdefault("DJANGO_SETTINGS_MODULE", "loopsweb.settings")
    done = subprocess.run(
        [*prefix, sys.executable, "-c", _EVIDENCE_CHECK, str(directory)],
        cwd=directory.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, (done.stdout.strip() or done.stderr.strip())


def _unprivileged(scratch: Path) -> tuple[str, ...] | None:
    """The first way in `_UNPRIVILEGED` that runs the check here (it takes a directory
    anyone may write); None when none does."""
    probe = scratch / "anyone-writes"
    probe.mkdir()
    probe.chmod(0o777)
    try:
        for prefix in _UNPRIVILEGED:
            if shutil.which(prefix[0]) is None:
                continue
            code, _ = _evidence_check(prefix, probe)
            if code == 0:
                return prefix
    finally:
        probe.rmdir()
    return None


@pytest.mark.slow  # as root, the check runs in processes of its own
def test_an_unwritable_evidence_directory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under a directory everyone can enter (tmp_path's parents may be private to root).
    scratch = Path(tempfile.mkdtemp(prefix="loopsweb-evidence-"))
    scratch.chmod(0o755)
    locked = scratch / "locked"
    locked.mkdir()
    locked.chmod(0o555)  # nobody may write it, its owner neither (without privilege)
    try:
        if os.getuid() == 0:
            # Root writes through any mode: the drain's check runs unprivileged instead.
            from domain.errors import ValidationError
            from routing.drains import run as drains

            prefix = _unprivileged(scratch)
            if prefix is None:
                pytest.skip(
                    "running as root, and neither runuser nor setpriv can run this "
                    "interpreter unprivileged here (as nobody or without capabilities)"
                )

            def prepare_unprivileged(directory: str) -> None:
                code, said = _evidence_check(prefix, Path(directory))
                if code == 3:
                    raise ValidationError(said)
                assert code == 0, said

            monkeypatch.setattr(drains, "evidence_dir_prepare", prepare_unprivileged)
        ingest(generic_event())
        report = drain(evidence_dir=str(locked))
        assert "is not writable" in report.error and report.counts["created"] == 0
        assert str(locked) in report.error
        assert not InboxEvent.objects.exclude(state="pending").exists()
    finally:
        locked.chmod(0o755)
        shutil.rmtree(scratch)


# --- #11 scanExhausted, #12 dry runs and the fatal message ----------------------------------------


def test_scan_exhausted_only_when_the_scan_window_ran_out_before_the_limit() -> None:
    ingest(*(generic_event(project=f"/srv/p{i}") for i in range(3)))
    full = drain(scan_limit=3, limit=2, dry_run=True).to_dict(compact=True)
    assert (full["scanned"], full["candidates"], full["scanExhausted"]) == (3, 3, False)
    short = drain(scan_limit=3, limit=5, dry_run=True).to_dict(compact=True)
    assert (short["scanned"], short["candidates"], short["scanExhausted"]) == (
        3,
        3,
        True,
    )
    roomy = drain(scan_limit=10, limit=5, dry_run=True).to_dict(compact=True)
    assert roomy["scanExhausted"] is False


def test_a_dry_run_drain_queues_and_logs_no_task(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ingest(*(generic_event(project=f"/srv/p{i}") for i in range(3)))
    with caplog.at_level(logging.INFO):
        report = drain(max_dispatch=3, dry_run=True)
    assert report.counts["created"] == 3
    assert not [r for r in caplog.records if "Enqueued" in r.getMessage()]
    assert not OrmQ.objects.exists()
    with caplog.at_level(logging.INFO):
        drain(max_dispatch=1)
    assert [
        r for r in caplog.records if "Enqueued" in r.getMessage()
    ]  # a real one does


def test_the_fatal_message_names_the_evidence_file_only_when_there_is_one(
    tmp_path: Path,
) -> None:
    ingest(generic_event(project=LONG_PATH))
    with pytest.raises(CommandError) as without:
        call_command("drain", "generic", stdout=io.StringIO())
    assert "evidence" not in str(without.value)
    ingest(generic_event(project=LONG_PATH))
    with pytest.raises(CommandError) as with_dir:
        call_command(
            "drain", "generic", "--evidence-dir", str(tmp_path), stdout=io.StringIO()
        )
    assert f"see {tmp_path}" in str(with_dir.value)


# --- #10 JSON Lines are read bounded ---------------------------------------------------------------


def _ingest_peak_rss_kb(path: Path, data_dir: Path) -> tuple[int, str]:
    code = (
        "import django, io, resource; django.setup(); "
        "from django.core.management import call_command; out = io.StringIO(); "
        "import sys\n"
        "try:\n"
        f"    call_command('ingest_events', {str(path)!r}, '--skip-invalid', stdout=out)\n"
        "except SystemExit: pass\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); print(out.getvalue())"
    )
    env = {
        **own_sqlite_env(data_dir),
        "PYTHONPATH": str(ROOT),
    }  # imports from another cwd
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=scratch_cwd(),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    peak, _, output = result.stdout.partition("\n")
    return int(peak), output


@pytest.mark.slow
@pytest.mark.own_database  # a throwaway SQLite file (own_sqlite_env)
def test_an_overlong_json_lines_line_is_refused_without_reading_it_whole(
    tmp_path: Path, migrated_sqlite: Callable[[Path], Path]
) -> None:
    migrated_sqlite(tmp_path / "data" / "loopsweb.sqlite3")
    good = json.dumps(generic_event()).encode() + b"\n"
    small = tmp_path / "small.jsonl"
    small.write_bytes(good + b'{"x": "' + b"y" * 2_000_000 + b'"}\n' + good)
    big = tmp_path / "big.jsonl"
    with big.open("wb") as handle:
        handle.write(good + b'{"x": "')
        chunk = b"y" * (1 << 20)
        for _ in range(200):  # a 200 MB line
            handle.write(chunk)
        handle.write(b'"}\n' + json.dumps(generic_event()).encode() + b"\n")
    small_peak, small_out = _ingest_peak_rss_kb(small, tmp_path / "data")
    big_peak, big_out = _ingest_peak_rss_kb(big, tmp_path / "data")
    assert "new=1" in small_out and "invalid=1" in small_out
    assert "new=1" in big_out and "invalid=1" in big_out and "line 2" in big_out
    # The 200 MB line costs no more than the 2 MB one, give or take 20 MB of noise.
    assert big_peak - small_peak < 20 * 1024, (small_peak, big_peak)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["routes", "list", "--limit", NINES],
            "--limit must be a whole number from 1 to 1000",
        ),
        (["routes", "invocations", "--limit", "1" + "0" * 20], "from 1 to 1000"),
        (
            ["drain", "generic", "--max-attempts", NINES],
            "--max-attempts must be at most 100",
        ),
        (
            ["drain", "generic", "--retry-backoff", NINES + "s"],
            "--retry-backoff must be at most",
        ),
    ],
)
def test_listing_and_retry_options_are_bounded_too(
    argv: list[str], message: str
) -> None:
    before = row_counts()
    with pytest.raises(CommandError, match=message):
        call_command(*argv, stdout=io.StringIO())
    assert row_counts() == before
