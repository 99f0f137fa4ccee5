from __future__ import annotations

import json

import pytest

from domain.errors import ValidationError
from domain.templates import (
    apply_pool_profiles,
    pool_roles_by_step,
    pool_routing_active,
    render_workflow,
    resolve_role_profiles,
    roles_for_template,
    step_account,
    template_for,
)

NO_PINS: dict[str, str | None] = {
    "triage": None,
    "planner": None,
    "worker": None,
    "verifier": None,
}


def test_todos_task_routes_default_to_worker_verifier() -> None:
    assert template_for("todos-task", None) == "todos-task-worker-verifier"
    assert template_for("todos-task", "  ") == "todos-task-worker-verifier"
    assert template_for("todos-task", "task-lifecycle") == "task-lifecycle"


@pytest.mark.parametrize("arg", ["event-worker-verifier", "lifecycle", "x"])
def test_todos_task_routes_reject_other_templates(arg: str) -> None:
    with pytest.raises(ValidationError) as exc:
        template_for("todos-task", arg)
    assert str(exc.value) == (
        "--template must be todos-task-worker-verifier or task-lifecycle "
        "for todos-task routes"
    )


def test_generic_routes_use_event_worker_verifier_only() -> None:
    assert template_for("generic-event", None) == "event-worker-verifier"
    assert template_for("generic-event", "event-worker-verifier") == (
        "event-worker-verifier"
    )
    with pytest.raises(ValidationError, match="event-worker-verifier for generic"):
        template_for("generic-event", "task-lifecycle")


def test_unknown_route_keys_are_rejected_by_template_for() -> None:
    with pytest.raises(ValidationError, match="route key must be"):
        template_for("generic", None)


def test_template_roles() -> None:
    assert roles_for_template("todos-task-worker-verifier") == ("worker", "verifier")
    assert roles_for_template("task-lifecycle") == (
        "triage",
        "planner",
        "worker",
        "verifier",
    )
    assert roles_for_template("event-worker-verifier") == ("worker", "verifier")
    with pytest.raises(ValidationError):
        roles_for_template("nope")


def test_lifecycle_steps_each_depend_on_the_previous_one() -> None:
    spec = render_workflow(
        template_id="task-lifecycle",
        provider="codewith",
        title="Fix login",
        description="Users cannot log in",
        project_path="/srv/app",
        route_key="todos-task",
        profiles={"worker": "acctA", "verifier": "acctB"},
    )
    assert spec["version"] == 1
    assert spec["goal"] is None
    assert [(s["id"], s["dependsOn"]) for s in spec["steps"]] == [
        ("triage", []),
        ("planner", ["triage"]),
        ("worker", ["planner"]),
        ("verifier", ["worker"]),
    ]
    json.dumps(spec)  # must be JSON-serialisable as stored


def test_rendered_step_shape() -> None:
    spec = render_workflow(
        template_id="todos-task-worker-verifier",
        provider="codewith",
        title="Fix login",
        description="Users cannot log in",
        project_path="/srv/app",
        route_key="todos-task",
        profiles={"worker": "acctA", "verifier": None},
    )
    worker, verifier = spec["steps"]
    assert worker["role"] == "worker"
    assert worker["kind"] == "agent"
    assert worker["routing"] == {"role": "worker"}
    target = worker["target"]
    assert {k: v for k, v in target.items() if k != "prompt"} == {
        "type": "agent",
        "provider": "codewith",
        "authProfile": "acctA",
        "cwd": "/srv/app",
        "sandbox": "workspace-write",
        "worktreeMode": "auto",
    }
    assert "Fix login" in target["prompt"]
    assert "Users cannot log in" in target["prompt"]
    assert verifier["target"]["authProfile"] is None


def test_prompts_carry_untrusted_text_verbatim_as_data() -> None:
    hostile = "$(rm -rf /); `whoami` 'quoted' \"double\""
    spec = render_workflow(
        template_id="event-worker-verifier",
        provider="claude",
        title=None,
        message=hostile,
        project_path="/srv/app",
        route_key="generic-event",
        profiles={},
    )
    prompt = spec["steps"][0]["target"]["prompt"]
    assert hostile in prompt
    assert "this event" in prompt


def test_role_pin_wins_over_pool_and_auth_profile() -> None:
    profiles = resolve_role_profiles(
        roles=["worker", "verifier"],
        pool=["acctA", "acctB", "acctC"],
        seed="task-42",
        auth_profile="fallback",
        pins={**NO_PINS, "verifier": " pinned "},
    )
    assert profiles == {"worker": "acctB", "verifier": "pinned"}


def test_single_member_pool_gives_every_role_that_member() -> None:
    profiles = resolve_role_profiles(
        roles=["worker", "verifier"],
        pool=["solo"],
        seed="task-42",
        auth_profile="fallback",
        pins=NO_PINS,
    )
    assert profiles == {"worker": "solo", "verifier": "solo"}


def test_auth_profile_is_the_fallback_without_a_pool() -> None:
    profiles = resolve_role_profiles(
        roles=["worker"], pool=[], seed="s", auth_profile="main", pins={}
    )
    assert profiles == {"worker": "main"}
    assert resolve_role_profiles(
        roles=["worker"], pool=[], seed="s", auth_profile=" ", pins={}
    ) == {"worker": None}


def test_pool_routing_needs_codewith_two_members_and_no_pins() -> None:
    pool = ["acctA", "acctB"]
    assert pool_routing_active(provider="codewith", pool=pool, pins=NO_PINS)
    assert not pool_routing_active(provider="claude", pool=pool, pins=NO_PINS)
    assert not pool_routing_active(
        provider="codewith", pool=["acctA", " "], pins=NO_PINS
    )


@pytest.mark.parametrize("role", ["triage", "planner", "worker", "verifier"])
def test_any_role_pin_disables_pool_routing(role: str) -> None:
    pins = {**NO_PINS, role: "acctA"}
    assert not pool_routing_active(provider="codewith", pool=["a", "b"], pins=pins)


def test_blank_pins_do_not_disable_pool_routing() -> None:
    pins = {**NO_PINS, "worker": "  "}
    assert pool_routing_active(provider="codewith", pool=["a", "b"], pins=pins)


def test_pool_profiles_replace_render_time_choices_on_codewith_steps() -> None:
    spec = render_workflow(
        template_id="todos-task-worker-verifier",
        provider="codewith",
        title="t",
        project_path="/p",
        route_key="todos-task",
        profiles={"worker": "acctB", "verifier": "acctC"},
    )
    assert pool_roles_by_step(spec) == {"worker": "worker", "verifier": "verifier"}
    routed = apply_pool_profiles(spec, {"worker": "acctA"})
    assert [s["target"]["authProfile"] for s in routed["steps"]] == ["acctA", "acctC"]
    # The input spec is left untouched.
    assert spec["steps"][0]["target"]["authProfile"] == "acctB"


def test_non_codewith_steps_are_not_pool_routed() -> None:
    spec = render_workflow(
        template_id="event-worker-verifier",
        provider="claude",
        title="t",
        project_path="/p",
        route_key="generic-event",
        profiles={},
    )
    assert pool_roles_by_step(spec) == {}


def test_codewith_step_pinned_to_a_profile_records_codewith_as_tool() -> None:
    step = {"target": {"type": "agent", "provider": "codewith", "authProfile": "acct1"}}
    assert step_account(step) == ("acct1", "codewith")


def test_step_account_ref_wins_over_the_agent_auth_profile() -> None:
    step = {
        "account": {"profile": "p", "tool": "claude"},
        "target": {"type": "agent", "provider": "codewith", "authProfile": "acct1"},
    }
    assert step_account(step) == ("p", "claude")


def test_target_account_ref_is_used_when_the_step_has_none() -> None:
    step = {
        "target": {"type": "agent", "provider": "claude", "account": {"profile": "p"}}
    }
    assert step_account(step) == ("p", None)


def test_account_ref_without_tool_takes_the_provider_when_an_auth_profile_exists() -> (
    None
):
    step = {
        "account": {"profile": "p"},
        "target": {"type": "agent", "provider": "codewith", "authProfile": "acct1"},
    }
    assert step_account(step) == ("p", "codewith")


def test_command_steps_record_no_account_unless_they_carry_one() -> None:
    assert step_account({"target": {"type": "command", "command": "make"}}) == (
        None,
        None,
    )
    step = {"target": {"type": "command", "account": {"profile": "p", "tool": "gh"}}}
    assert step_account(step) == ("p", "gh")


def test_agent_step_without_auth_profile_records_nothing() -> None:
    step = {"target": {"type": "agent", "provider": "codewith", "authProfile": None}}
    assert step_account(step) == (None, None)


def test_rendered_steps_attribute_to_their_profiles() -> None:
    spec = render_workflow(
        template_id="todos-task-worker-verifier",
        provider="codewith",
        title="t",
        project_path="/p",
        route_key="todos-task",
        profiles={"worker": "acctA", "verifier": "acctB"},
    )
    assert [step_account(s) for s in spec["steps"]] == [
        ("acctA", "codewith"),
        ("acctB", "codewith"),
    ]


def test_a_pool_of_registered_accounts_of_the_provider_routes_for_any_provider() -> (
    None
):
    registered = {"a": "claude", "b": "claude", "c": "codex"}
    assert pool_routing_active(
        provider="claude", pool=["a", "b"], pins=NO_PINS, registered=registered
    )
    # One member unregistered, or of another provider: upstream (no routing).
    assert not pool_routing_active(
        provider="claude", pool=["a", "x"], pins=NO_PINS, registered=registered
    )
    assert not pool_routing_active(
        provider="claude", pool=["a", "c"], pins=NO_PINS, registered=registered
    )
    pins = {**NO_PINS, "worker": "a"}
    assert not pool_routing_active(
        provider="claude", pool=["a", "b"], pins=pins, registered=registered
    )
