"""A database error that passes never fails a run (issue 28, the runner's part): while the
database refuses the runner's writes (SQLite locked by another writer, PostgreSQL read-only
and the runner's connection dropped), the runner tries the same write again, and the run
goes on where it was once the database takes it; a database away for a whole lease stops
the runner and leaves the run as it was. Both on both backends, with real `manage.py
run_workflow` processes against the test database; the step is a real process that waits
for the test's signal.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import IO

import pytest
from django.db import connection

from ledger.models import RunStatus, StepStatus, WorkflowRun, WorkflowStepRun
from tests.ledger.runner_helpers import (
    admit_workflow,
    command_step,
    process_alive,
    spawn_runner,
    wait_for,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WAIT_FOR_FILE = (
    "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)"
)
RETRY_LINE = "the database did not take it"


def _run_waiting_for(go: Path) -> WorkflowRun:
    return admit_workflow(
        [
            command_step("first", sys.executable, "-c", WAIT_FOR_FILE, str(go)),
            command_step("second", sys.executable, "-c", "pass", depends_on=["first"]),
        ]
    )


def _first_step(run: WorkflowRun) -> WorkflowStepRun:
    return WorkflowStepRun.objects.get(workflow_run=run, step_id="first")


def _statuses(run: WorkflowRun) -> tuple[str, dict[str, str]]:
    run.refresh_from_db()
    steps = dict(
        WorkflowStepRun.objects.filter(workflow_run=run).values_list(
            "step_id", "status"
        )
    )
    return run.status, steps


def _finish(runner: subprocess.Popen[str]) -> tuple[str, str]:
    return runner.communicate(timeout=120)


class _Output:
    """A process's stdout and stderr, read while it runs (the test waits on its lines)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self._proc = proc
        self._text: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._pump, args=(name, stream), daemon=True)
            for name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr))
        ]
        for thread in self._threads:
            thread.start()

    def _pump(self, name: str, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            with self._lock:
                self._text[name].append(line)

    def stderr(self) -> str:
        with self._lock:
            return "".join(self._text["stderr"])

    def finish(self) -> tuple[str, str]:
        """(stdout, stderr) once the process ended and both pipes are read to the end."""
        self._proc.wait(timeout=120)
        for thread in self._threads:
            thread.join(timeout=120)
            assert not thread.is_alive(), "the runner's output never ended"
        with self._lock:
            return "".join(self._text["stdout"]), "".join(self._text["stderr"])


@contextmanager
def _sqlite_writer_holds_the_lock() -> Iterator[None]:
    holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def _drop_other_postgresql_sessions() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            [connection.settings_dict["NAME"]],
        )


@contextmanager
def _postgresql_read_only() -> Iterator[None]:
    # New sessions are read-only; the runner's is dropped, so its next is one of them.
    name = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        cursor.execute(
            f'ALTER DATABASE "{name}" SET default_transaction_read_only = on'
        )
    _drop_other_postgresql_sessions()
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                f'ALTER DATABASE "{name}" RESET default_transaction_read_only'
            )
        _drop_other_postgresql_sessions()  # its read-only session goes; the next writes


Refusing = tuple[Callable[[], AbstractContextManager[None]], dict[str, str]]


@pytest.fixture
def refusing() -> Refusing:
    """How this backend refuses the runner's writes, and the runner's extra environment:
    SQLite locked by another writer (the runner gives up on the lock after 1 s instead of
    20 s, and tries again); PostgreSQL read-only, with the runner's connection dropped."""
    if connection.vendor == "sqlite":
        return _sqlite_writer_holds_the_lock, {"SQLITE_BUSY_TIMEOUT": "1"}
    return _postgresql_read_only, {}


def _wait_for_the_first_step(run: WorkflowRun) -> WorkflowStepRun:
    return wait_for(
        lambda: (s := _first_step(run)).pid and s.status == StepStatus.RUNNING and s,
        what="the first step running",
    )


def test_a_database_that_refuses_writes_delays_the_run_and_fails_nothing(
    tmp_path: Path, refusing: Refusing
) -> None:
    refused, extra_env = refusing
    go = tmp_path / "go"
    run = _run_waiting_for(go)
    runner = spawn_runner(
        run.id, extra_env={"LOOPSWEB_RUN_LEASE_SECONDS": "60", **extra_env}
    )
    output = _Output(runner)
    try:
        step = _wait_for_the_first_step(run)
        with refused():
            go.touch()  # the step ends; its record is the write the database refuses
            wait_for(lambda: not process_alive(step.pid), what="the step's exit")
            # Refused, and refused again: each try is a line of the runner's.
            wait_for(
                lambda: output.stderr().count(RETRY_LINE) >= 2,
                what="two refused tries in the runner's output",
            )
            # The run is as it was: nothing failed, nothing skipped.
            assert _statuses(run) == (
                RunStatus.RUNNING,
                {"first": StepStatus.RUNNING, "second": StepStatus.PENDING},
            )
            assert runner.poll() is None
        stdout, stderr = output.finish()
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 0, stderr
    assert RETRY_LINE in stderr, stderr
    assert "Traceback" not in stderr, stderr
    assert f"run {run.id} succeeded" in stdout
    assert _statuses(run) == (
        RunStatus.SUCCEEDED,
        {"first": StepStatus.SUCCEEDED, "second": StepStatus.SUCCEEDED},
    )


def test_a_database_away_for_a_whole_lease_leaves_the_run_as_it_was(
    tmp_path: Path, refusing: Refusing
) -> None:
    """The runner stops, says why in one line and writes nothing: the run stays running
    with its steps as they were, for lease recovery (no "runner error" failure)."""
    refused, extra_env = refusing
    go = tmp_path / "go"
    run = _run_waiting_for(go)
    runner = spawn_runner(
        run.id, extra_env={"LOOPSWEB_RUN_LEASE_SECONDS": "2", **extra_env}
    )
    try:
        step = _wait_for_the_first_step(run)
        with refused():
            go.touch()
            stdout, stderr = _finish(runner)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert not process_alive(step.pid)
    assert runner.returncode == 1, stderr
    assert RETRY_LINE in stderr, stderr
    assert "the run is left as it was" in stderr, stderr
    assert "the database is unavailable" in stderr, stderr
    assert "Traceback" not in stderr, stderr
    assert _statuses(run) == (
        RunStatus.RUNNING,
        {"first": StepStatus.RUNNING, "second": StepStatus.PENDING},
    )
    assert WorkflowRun.objects.get(pk=run.id).error is None
