"""The context builder: a token budget per part counted with the packaged tokenizer, anchors tied to step and
memory ids, and compression asked for when the history outgrows its part."""

from __future__ import annotations

import pytest
from fakes import FakeSessionRepository

from libs.tokens import packaged_tokenizer
from services.orchestrator.adapters.local import LocalMemory, LocalTools
from services.orchestrator.adapters.rules_file import DEFAULT_RULES
from services.orchestrator.domain.context import Budget, ContextInput, build_context
from services.orchestrator.domain.rulebook import parse_rulebook
from services.orchestrator.service_layer.agent import Agent
from services.orchestrator.service_layer.handlers import SendMessage, send_message
from services.orchestrator.service_layer.planner import DECISION_PROMPT

BOOK = parse_rulebook(DEFAULT_RULES.read_text(encoding="utf-8"))
COUNTER = packaged_tokenizer()
SMALL = Budget(window=1200, system=360, tools=60, memory=120, history=80, task=60, min_reserve=200)


def test_the_packaged_tokenizer_counts_real_tokens_in_english_and_chinese() -> None:
    assert COUNTER.count("Where is my order?") == 5
    assert COUNTER.count("我喜欢喝绿茶") == 6  # one token a character
    assert COUNTER.count("") == 0
    cut = COUNTER.truncate("unbelievably long words everywhere", 2)
    assert COUNTER.count(cut) == 2 and "unbelievably long words everywhere".startswith(cut)


def test_a_budget_that_leaves_less_than_the_minimum_reserve_is_refused() -> None:
    with pytest.raises(ValueError, match="min_reserve"):
        Budget(window=1000, system=300, tools=300, memory=300, history=0, task=0, min_reserve=200)


def test_a_system_prompt_larger_than_its_part_is_refused_rather_than_cut() -> None:
    with pytest.raises(ValueError, match="Budget.system"):
        build_context(ContextInput(system=DECISION_PROMPT, task="hi"), COUNTER, Budget(system=100))


def test_every_part_stays_within_its_budget_and_the_best_pieces_come_first() -> None:
    memories = [(f"m-{i}", f"memory number {i}: the customer likes item {i} " * 3) for i in range(20)]
    tools = [(f"tool.{i}", "looks something up by its identifier " * 2) for i in range(10)]
    context = build_context(ContextInput(system=DECISION_PROMPT[:300], task="what do I like?", tools=tools,
                                         memories=memories), COUNTER, SMALL)
    for part in ("system", "tools", "memory", "history", "task"):
        assert context.used[part] <= getattr(SMALL, part), part
    assert context.used["reserve"] >= SMALL.min_reserve
    kept = [a for a in context.anchors if a.startswith("memory:")]
    assert kept and kept == [f"memory:m-{i}" for i in range(len(kept))]  # best first, in order
    assert f"memory:m-{len(kept)}" in context.dropped and "memory:m-19" in context.dropped
    assert context.tools == tuple(f"tool.{i}" for i in range(len(context.tools))) and len(context.tools) < 10


def test_tool_results_and_memories_are_injected_under_anchors_of_their_ids() -> None:
    context = build_context(ContextInput(
        system="Decide.", task="And the invoice?", steps=[("a-1", "orders.get_status", '{"status": "shipped"}')],
        memories=[("m-7", "我的订单号是 A12345")]), COUNTER, SMALL)
    injected = context.messages[1]["content"]
    assert "[step:a-1] orders.get_status answered {\"status\": \"shipped\"}" in injected
    assert "[memory:m-7] 我的订单号是 A12345" in injected
    assert injected.index("[step:a-1]") < injected.index("[memory:m-7]")
    assert context.anchors == ("step:a-1", "memory:m-7")
    assert context.messages[-1] == {"role": "user", "content": "And the invoice?"}


def test_a_history_longer_than_its_part_keeps_the_newest_turns_and_asks_for_compression() -> None:
    history = [("user" if i % 2 == 0 else "assistant", f"turn {i} talks about parcels and deliveries")
               for i in range(30)]
    context = build_context(ContextInput(system="Decide.", task="next?", history=history), COUNTER, SMALL)
    assert context.compress_history
    shown = next(m["content"] for m in context.messages if m["content"].startswith("Earlier"))
    assert "turn 29" in shown and "turn 0 " not in shown
    assert shown.index("turn 28") < shown.index("turn 29")  # still in order
    short = build_context(ContextInput(system="Decide.", task="next?", history=history[-2:]), COUNTER, SMALL)
    assert not short.compress_history


class RecordingModel:
    def __init__(self) -> None:
        self.seen: list[list[dict]] = []

    async def decide(self, messages, tools):
        self.seen.append(messages)
        return {"action": "reply", "text": "I do not know yet."}


async def test_the_loop_writes_turns_gives_the_model_its_context_and_compresses_a_long_history() -> None:
    sessions, memory, model = FakeSessionRepository(), LocalMemory(), RecordingModel()
    agent = Agent(sessions, lambda: BOOK, memory, LocalTools(), memory, model, tool_deadline_seconds=5.0,
                  budget=SMALL)
    memory.remember("u1", "m-1", "The customer asked about tea before")
    for i in range(8):
        await send_message(SendMessage("acme", "u1", "s1", "web", f"question {i} about tea and the weather"),
                           sessions, agent)
    first = model.seen[0]
    assert first[0]["content"] == DECISION_PROMPT
    assert any("[memory:m-1] The customer asked about tea before" in m["content"] for m in first)
    assert first[-1] == {"role": "user", "content": "question 0 about tea and the weather"}
    assert memory.compressed == ["s1"]  # once the history outgrew its 80 tokens
    summary = next(hit for hit, _ in memory.memories if hit.memory_id.startswith("summary-s1"))
    assert "user: question 0 about tea and the weather" in summary.content and summary.must_confirm
    assert [role for role, _, _ in memory.turns["s1"]][:2] == ["user", "assistant"]  # turns after the summary
