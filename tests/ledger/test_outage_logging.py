"""django-q2's own processes during an outage (ledger.dberrors.PassingErrorLine): a passing
database error is one line without its traceback, not one per poll; any other error keeps
its traceback."""

from __future__ import annotations

import logging

import pytest
from django.db import OperationalError

from ledger.dberrors import PassingErrorLine


class _Lost(Exception):
    sqlstate = "08006"  # connection_failure: passes


def _lost() -> OperationalError:
    try:
        try:
            raise _Lost("server closed the connection unexpectedly\n\tdetail")
        except _Lost as cause:
            raise OperationalError(
                "server closed the connection unexpectedly"
            ) from cause
    except OperationalError as exc:
        return exc


def test_the_django_q_logger_says_a_passing_error_once_without_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("django-q")
    assert any(isinstance(f, PassingErrorLine) for f in logger.filters)
    with caplog.at_level(logging.ERROR, logger="django-q"):
        for _ in range(5):
            error = _lost()
            logger.error(
                "Could not save task result", exc_info=(type(error), error, None)
            )
        try:
            raise ValueError("a bug")
        except ValueError:
            logger.exception("Could not create task from schedule")
    lines = [r for r in caplog.records if r.name == "django-q"]
    assert len(lines) == 2, [r.getMessage() for r in lines]
    first, bug = lines
    assert first.getMessage().startswith(
        "Could not save task result: the database is away"
    )
    assert first.exc_info is None
    assert bug.exc_info is not None
