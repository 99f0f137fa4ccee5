"""The admission lock's limits (issue 44): a wait gives up, a hung holder is ended by the
server, both errors pass, and the server says who holds the lock. Real PostgreSQL."""

from __future__ import annotations

import threading

import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.urls import reverse

from ledger.dberrors import connection_lost, error_passes
from ledger.lock import ADMISSION_KEY, ADVISORY_NAMESPACE, admission_lock, lock_state
from routing.metrics.views import lock_families, render
from tests.ledger.runner_helpers import admission_lock_held
from tests.waiting import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_a_wait_for_the_lock_gives_up_with_an_error_that_passes(settings) -> None:
    settings.LOOPSWEB_LOCK_WAIT_TIMEOUT_SECONDS = 1
    with admission_lock_held():
        with pytest.raises(DatabaseError) as caught, transaction.atomic():
            admission_lock()
        assert error_passes(caught.value) and not connection_lost(caught.value)
        state = lock_state()
    assert state is not None
    assert (state.holder, state.holder_pid, state.holder_idle) == ("host-x", 4321, True)
    assert state.waiters == 0


@pytest.mark.slow  # the server's 1 s limit must run out
def test_a_holder_that_idles_is_ended_by_the_server_and_the_error_passes(
    settings,
) -> None:
    settings.LOOPSWEB_LOCK_IDLE_TIMEOUT_SECONDS = 1
    watcher = connections.create_connection("default")

    def holders() -> int:
        with watcher.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                " AND classid = %s AND objid = %s AND database ="
                " (SELECT oid FROM pg_database WHERE datname = current_database())",
                [ADVISORY_NAMESPACE, ADMISSION_KEY],
            )
            return int(cursor.fetchone()[0])

    try:
        with pytest.raises(DatabaseError) as caught:
            with transaction.atomic():
                admission_lock()
                assert holders() == 1
                # This process sends nothing now (as if stopped): the server ends it.
                wait_for(lambda: holders() == 0, what="the server to end the holder")
                with connection.cursor() as cursor:
                    cursor.execute("SELECT 1")
        assert error_passes(caught.value) and connection_lost(caught.value)
    finally:
        watcher.close()
        connection.close()
    with transaction.atomic():  # a new connection takes the lock at once
        admission_lock()


@pytest.mark.slow  # a wait must last the 1 s after which it counts as long
def test_a_long_wait_shows_its_holder_on_ops_and_metrics(admin_client) -> None:
    def wait() -> None:
        waiter = connections.create_connection("default")  # this thread's own
        try:
            with waiter.cursor() as cursor:
                cursor.execute("BEGIN")
                cursor.execute(
                    "SELECT pg_advisory_xact_lock(%s, %s)",
                    [ADVISORY_NAMESPACE, ADMISSION_KEY],
                )
        except DatabaseError:
            pass  # the holder's connection went first
        finally:
            waiter.close()

    with admission_lock_held():
        thread = threading.Thread(target=wait)
        thread.start()
        wait_for(
            lambda: (s := lock_state()) and s.longest_wait_seconds >= 1.0,
            what="a wait of a second",
        )
        html = admin_client.get(reverse("ops:hosts")).content.decode()
        text = render(lock_families())
    thread.join()
    assert "1 transaction waits for the admission lock" in html
    assert "held by host <code>host-x</code> (process 4321)" in html
    assert "sending nothing" in html
    assert "loopsweb_admission_lock_waiters 1" in text
    assert 'loopsweb_admission_lock_held_seconds{host="host-x",idle="true"}' in text
    # The waiter's connection is closed, but the server ends its session (and so releases
    # the lock it took once the holder let go) a moment later, more so on a busy machine.
    wait_for(
        lambda: (
            "Free: no transaction holds it or waits for it."
            in admin_client.get(reverse("ops:hosts")).content.decode()
        ),
        what="the hosts page to show the lock free",
    )
