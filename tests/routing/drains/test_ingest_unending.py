"""`ingest_events` on input whose line never ends (issue 28, 5).

`ingest_events /dev/zero` used to read for ever with flat memory: an overlong line was
skipped chunk by chunk until a newline that never comes. Now the first overlong line ends
the read (without --skip-invalid the file is refused anyway), and with --skip-invalid the
search for its end stops after LOOPSWEB_MAX_INGEST_BYTES. Real `manage.py` processes on the
suite's database, with a wall-clock limit that today's main runs into.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from routing.models import InboxEvent
from tests.ledger.runner_helpers import child_database_url
from tests.processes import MANAGE_PY, scratch_cwd
from tests.routing.helpers import generic_event

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _ingest(
    *args: str, stdin: object = None, **env: str
) -> subprocess.CompletedProcess[str]:
    child = dict(os.environ)
    child.update(DATABASE_URL=child_database_url(), **env)
    return subprocess.run(
        [sys.executable, MANAGE_PY, "ingest_events", *args],
        cwd=scratch_cwd(),
        env=child,
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=90,  # main: never returns
    )


def test_dev_zero_is_refused_after_one_line_of_its_limit() -> None:
    done = _ingest("/dev/zero", "--json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["invalidEvents"] == [
        {"at": "line 1", "error": "envelope is larger than 1048576 bytes"}
    ]
    assert "nothing stored" in done.stderr and "Traceback" not in done.stderr
    assert InboxEvent.objects.count() == 0


def test_dev_zero_on_stdin_is_refused_too() -> None:
    with open("/dev/zero", "rb") as zeros:
        done = _ingest("-", stdin=zeros)
    assert done.returncode == 1 and "invalid=1" in done.stdout, done.stderr
    assert InboxEvent.objects.count() == 0


def test_skip_invalid_stops_looking_for_the_end_after_the_ingest_limit() -> None:
    done = _ingest(
        "/dev/zero", "--skip-invalid", LOOPSWEB_MAX_INGEST_BYTES=str(8 * 1024 * 1024)
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "CommandError: line 1 is larger than 1048576 bytes (LOOPSWEB_MAX_EVENT_BYTES) "
        "and has no end within 8388608 bytes (LOOPSWEB_MAX_INGEST_BYTES); nothing stored"
    )
    assert InboxEvent.objects.count() == 0


def test_an_endless_line_after_good_lines_stores_none_of_them(tmp_path: Path) -> None:
    path = tmp_path / "head.jsonl"
    path.write_bytes(json.dumps(generic_event()).encode() + b"\n")
    with open(path, "rb") as good:
        # `cat head.jsonl /dev/zero | ingest_events - --skip-invalid`
        cat = subprocess.Popen(
            ["cat", "-", "/dev/zero"], stdin=good, stdout=subprocess.PIPE
        )
        try:
            done = _ingest(
                "-",
                "--skip-invalid",
                stdin=cat.stdout,
                LOOPSWEB_MAX_INGEST_BYTES=str(4 * 1024 * 1024),
            )
        finally:
            cat.kill()
            cat.wait()
    assert done.returncode == 1 and "has no end within" in done.stderr
    assert InboxEvent.objects.count() == 0


def test_an_overlong_line_that_ends_is_still_skipped_with_skip_invalid(
    tmp_path: Path,
) -> None:
    path = tmp_path / "mixed.jsonl"
    good = json.dumps(generic_event()).encode() + b"\n"
    path.write_bytes(good + b"x" * (3 * 1024 * 1024) + b"\n")
    done = _ingest(str(path), "--skip-invalid")
    assert done.returncode == 0, done.stderr
    assert "new=1" in done.stdout and "invalid=1" in done.stdout
    assert InboxEvent.objects.count() == 1
