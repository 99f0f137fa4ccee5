from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from routing.models import InboxEvent

pytestmark = pytest.mark.django_db


def _ingest(path: Path, *args: str) -> dict:
    out = io.StringIO()
    call_command("ingest_events", str(path), "--json", *args, stdout=out)
    return json.loads(out.getvalue())


def test_json_lines_are_loaded_idempotently(tmp_path: Path) -> None:
    lines = [
        {
            "id": str(i),
            "type": "task.created",
            "source": "todos",
            "data": {"project_path": "/p"},
        }
        for i in range(5)
    ]
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in lines) + "\n\n")
    assert _ingest(path)["new"] == 5
    again = _ingest(path)
    assert again["new"] == 0 and again["duplicate"] == 5
    assert InboxEvent.objects.count() == 5
    assert set(InboxEvent.objects.values_list("project_hint", flat=True)) == {"/p"}


def test_a_json_array_and_a_single_pretty_printed_envelope_are_accepted(
    tmp_path: Path,
) -> None:
    array = tmp_path / "a.json"
    array.write_text(
        json.dumps(
            [
                {"id": "a", "type": "t", "source": "s"},
                {"id": "a", "type": "t", "source": "s"},
            ]
        )
    )
    report = _ingest(array)
    assert report["new"] == 1 and report["duplicate"] == 1
    single = tmp_path / "b.json"
    single.write_text(
        json.dumps({"id": "b", "type": "t", "source": "s", "subject": "x"}, indent=2)
    )
    assert _ingest(single)["new"] == 1
    assert InboxEvent.objects.get(event_id="b").subject == "x"


def test_invalid_lines_are_reported_with_numbers_and_nothing_is_stored(
    tmp_path: Path,
) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_text(
        '{"id": "1", "type": "t", "source": "s"}\n{oops\n{"id": "2", "type": "t"}\n'
    )
    out = io.StringIO()
    with pytest.raises(CommandError, match="2 invalid envelope"):
        call_command("ingest_events", str(path), stdout=out)
    assert "invalid line 2: invalid JSON" in out.getvalue()
    assert "invalid line 3: event.source is required" in out.getvalue()
    assert InboxEvent.objects.count() == 0
    report = _ingest(path, "--skip-invalid")
    assert (
        report["new"] == 1
        and report["invalid"] == 2
        and InboxEvent.objects.count() == 1
    )


def test_dry_run_classifies_without_storing(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_text('{"id": "1", "type": "t", "source": "s"}\n')
    assert _ingest(path, "--dry-run")["new"] == 1
    assert InboxEvent.objects.count() == 0


def test_an_oversized_envelope_is_invalid(tmp_path: Path, settings) -> None:
    settings.LOOPSWEB_MAX_EVENT_BYTES = 2048
    path = tmp_path / "big.jsonl"
    path.write_text(
        '{"id": "1", "type": "t", "source": "s"}\n'
        + json.dumps({"id": "2", "type": "t", "source": "s", "data": {"x": "y" * 5000}})
        + "\n"
    )
    report = _ingest(path, "--skip-invalid")
    assert (
        report["new"] == 1
        and "larger than 2048 bytes" in report["invalidEvents"][0]["error"]
    )


def test_a_missing_file_is_a_clear_error() -> None:
    with pytest.raises(CommandError, match="cannot read /nonexistent/x.jsonl"):
        call_command("ingest_events", "/nonexistent/x.jsonl", stdout=io.StringIO())
