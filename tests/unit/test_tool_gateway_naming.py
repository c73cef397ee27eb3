"""Names of federated tools: prefixed, valid, at most 64 characters, unique, stable."""

from __future__ import annotations

from services.tool_gateway.domain.naming import MAX_NAME, exposed_name
from services.tool_gateway.domain.registry import _NAME


def test_an_upstream_tool_is_exposed_under_its_prefix_as_a_valid_registry_name() -> None:
    assert exposed_name("time", "get_current_time", set()) == "time.get_current_time"
    assert exposed_name("git", "Git-Status", set()) == "git.git_status"
    assert exposed_name("", "echo", set()) == "echo"
    assert _NAME.match(exposed_name("x", "9lives", set()))


def test_a_name_over_64_characters_is_shortened_with_a_stable_hash() -> None:
    long = "a_tool_whose_name_is_much_too_long_to_be_exposed_under_a_prefix_as_it_is"
    first, again = exposed_name("local", long, set()), exposed_name("local", long, set())
    assert first == again and len(first) <= MAX_NAME and first.startswith("local.a_tool")


def test_a_clash_gets_a_different_name() -> None:
    taken = {exposed_name("a", "b_c", set())}
    clash = exposed_name("a", "b-c", taken)  # "b-c" becomes "b_c" too
    assert clash not in taken and clash.startswith("a.b_c_")
