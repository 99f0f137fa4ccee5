from __future__ import annotations

from domain.scope import resolve_route_scope


def test_explicit_scope_wins_and_is_trimmed() -> None:
    env = {"LOOPS_LOOP_NAME": "nightly-drain"}
    assert (
        resolve_route_scope(explicit="  mine ", env=env, route_key="todos-task")
        == "mine"
    )


def test_loop_name_from_the_environment_is_used_without_an_explicit_scope() -> None:
    env = {"LOOPS_LOOP_NAME": " nightly-drain\n"}
    assert (
        resolve_route_scope(explicit=None, env=env, route_key="todos-task")
        == "nightly-drain"
    )


def test_blank_explicit_scope_falls_through_to_the_loop_name() -> None:
    env = {"LOOPS_LOOP_NAME": "nightly-drain"}
    assert (
        resolve_route_scope(explicit="   ", env=env, route_key="todos-task")
        == "nightly-drain"
    )


def test_route_key_is_the_final_fallback() -> None:
    assert (
        resolve_route_scope(
            explicit="", env={"LOOPS_LOOP_NAME": " "}, route_key="generic-event"
        )
        == "generic-event"
    )
    assert (
        resolve_route_scope(explicit=None, env={}, route_key="todos-task")
        == "todos-task"
    )
