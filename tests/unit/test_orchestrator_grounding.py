"""The agent loop over fakes: grounded replies, the model's decisions checked, the rules file reloaded."""

from __future__ import annotations

from pathlib import Path

from orchestrator_world import World

from services.orchestrator.adapters.rules_file import DEFAULT_RULES, RulesFile
from services.orchestrator.domain import State, StateChanged

# --- grounded output ---------------------------------------------------------------------------------------


class ScriptedModel:
    def __init__(self, *answers) -> None:
        self.answers, self.asked = list(answers), 0

    async def decide(self, messages, tools):
        self.asked += 1
        return self.answers.pop(0)


async def test_a_reply_with_an_invented_number_is_never_sent() -> None:
    world = World(ScriptedModel({"action": "reply", "text": "You have 42 loyalty points."}))
    world.memory.remember("u1", "m-1", "The user has loyalty points", strong=True)
    session = await world.say("how many loyalty points do I have?")
    texts = [m.text for m in session.messages if m.role == "assistant"]
    assert all("42" not in t for t in texts)
    assert any("replaced by a template" in e.reason for e in await world.events(StateChanged))


async def test_an_invalid_model_decision_is_retried_once_then_the_planner_decides() -> None:
    model = ScriptedModel({"action": "dance"}, {"action": "tool", "tool": "no.such.tool", "arguments": {}})
    world = World(model)
    session = await world.say("tell me something")
    assert model.asked == 2
    assert session.state == State.IDLE
    reasons = [e.reason for e in await world.events(StateChanged)]
    assert any("decided by planner after refusing" in r and "no.such.tool" in r for r in reasons)


async def test_a_valid_model_tool_decision_calls_that_tool() -> None:
    world = World(ScriptedModel({"action": "tool", "tool": "billing.get_invoice", "arguments": {"order_id": "C1234"}}))
    session = await world.say("what do I owe?")
    assert world.tools.calls[0][:2] == ("billing.get_invoice", {"order_id": "C1234"})
    assert session.state == State.IDLE


# --- rules file --------------------------------------------------------------------------------------------


def test_a_changed_rules_file_is_reloaded_and_a_bad_one_is_refused_with_its_line_keeping_the_old_rules(
        tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("rules:\n  - name: hi\n    action: reply\n    keywords: [hi]\n    reply: Hi!\n")
    rules = RulesFile(path)
    assert rules().match("hi there").name == "hi"

    path.write_text("rules:\n  - name: bye\n    action: reply\n    keywords: [bye]\n    reply: Bye!\n  - x\n")
    assert rules.reload_if_changed() is False
    assert (rules.last_error.line, "a rule is a mapping" in rules.last_error.reason) == (6, True)
    assert rules().match("hi there").name == "hi"

    path.write_text("rules:\n  - name: slow\n    action: block\n    regex: '(a+)+\\1'\n")
    assert rules.reload_if_changed() is False
    assert rules.last_error.line == 4 and "linear time" in rules.last_error.reason

    path.write_text("rules:\n  - name: bye\n    action: reply\n    keywords: [bye, 再见]\n    reply: Bye!\n")
    assert rules.reload_if_changed() is True and rules.last_error is None
    assert rules().match("再见").name == "bye" and rules().match("hi") is None


async def test_new_interrupt_phrases_in_the_rules_file_take_effect_without_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    text = DEFAULT_RULES.read_text(encoding="utf-8")
    path.write_text(text)
    rules = RulesFile(path)
    world = World()
    world.agent.rules = rules
    assert world.agent.detector().detect("halt") is None
    path.write_text(text.replace("hard: [cancel,", "hard: [halt, cancel,"))
    assert rules.reload_if_changed()
    assert world.agent.detector().detect("halt").kind == "hard"
