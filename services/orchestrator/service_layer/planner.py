"""Decisions the rules leave open: an LLM's structured decision, validated, or the deterministic planner.

The LLM must answer with a decision matching DECISION_SCHEMA; an invalid one is retried once,
then the deterministic planner decides. With no LLM configured the planner decides directly:
a memory that answers the question becomes a reply citing it, anything else an honest
"I could not find that".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from jsonschema import ValidationError

from libs.logs import get_logger
from libs.safe_schema import SafeValidator
from services.orchestrator.domain import DecisionMade
from services.orchestrator.domain.rulebook import RuleBook
from services.orchestrator.service_layer.ports import DecisionMaker, MemoryHit, ToolInfo

__all__ = ["DECISION_PARAMETERS", "DECISION_PROMPT", "DECISION_SCHEMA", "Planned", "decide_open_question"]

log = get_logger(__name__)

DECISION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["action"],
    "additionalProperties": False,
    "properties": {
        "action": {"enum": ["tool", "reply", "ask", "human", "delegate"]},
        "tool": {"type": "string", "maxLength": 128},
        "agent": {"type": "string", "maxLength": 128},
        "arguments": {"type": "object"},
        "text": {"type": "string", "maxLength": 4000},
    },
    "allOf": [
        {"if": {"properties": {"action": {"const": "tool"}}}, "then": {"required": ["tool", "arguments"]}},
        {"if": {"properties": {"action": {"enum": ["reply", "ask"]}}}, "then": {"required": ["text"]}},
        {"if": {"properties": {"action": {"const": "delegate"}}}, "then": {"required": ["agent", "text"]}},
    ],
}
# What the model is asked to fill (the function's parameters): the schema's shape without its limits and
# conditions, which servers that turn a schema into a grammar (llama.cpp) cannot all compile (a 4,000-
# character limit becomes a rule repeated 4,000 times). DECISION_SCHEMA itself still validates the answer.
DECISION_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "required": ["action"],
    "properties": {"action": {"enum": ["tool", "reply", "ask", "human", "delegate"]}, "tool": {"type": "string"},
                   "agent": {"type": "string"}, "arguments": {"type": "object"}, "text": {"type": "string"}},
}
_VALIDATOR = SafeValidator(DECISION_SCHEMA)
MIN_MEMORY_SCORE = 0.2


@dataclass(frozen=True)
class Planned:
    decision: DecisionMade
    problems: tuple[str, ...] = ()  # why LLM answers were refused before this decision


def _problem(raw: Any, tools: list[ToolInfo], book: RuleBook) -> str | None:
    try:
        _VALIDATOR.validate(raw)
    except ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "decision"
        return f"{where}: {exc.message}"
    if raw["action"] == "tool" and raw["tool"] not in {t.name for t in tools}:
        return f"tool {raw['tool']!r} is not one the caller may use"
    if raw["action"] == "delegate" and raw["agent"] not in book.agents:
        return f"agent {raw['agent']!r} is not one of the agents declared in the rules ({', '.join(sorted(book.agents)) or 'none'})"
    return None


def _agents_message(book: RuleBook) -> list[dict[str, str]]:
    """The agents the model may delegate to (action "delegate", with agent and text), when there are any."""
    if not book.agents:
        return []
    listed = "\n".join(f"- {a.name}: {a.description[:200]}" for a in book.agents.values())
    return [{"role": "system", "content": f"Agents you may delegate to (action delegate, agent, text):\n{listed}"}]


def _llm_decision(task_id: str, raw: dict[str, Any], memories: list[MemoryHit]) -> DecisionMade:
    if raw["action"] == "tool":
        arguments = json.dumps(raw.get("arguments", {}), ensure_ascii=False)
    elif raw["action"] == "delegate":
        arguments = json.dumps({"agent": raw["agent"], "text": raw["text"]}, ensure_ascii=False)
    else:
        arguments = _memory_sources(memories)
    return DecisionMade(task_id, "llm", raw["action"], tool=raw.get("tool", "") if raw["action"] == "tool" else "",
                        arguments_json=arguments, text=raw.get("text", ""))


def _memory_sources(memories: list[MemoryHit]) -> str:
    return json.dumps({"sources": [{"ref": m.memory_id, "text": m.content} for m in memories]}, ensure_ascii=False)


def _planner(task_id: str, memories: list[MemoryHit], book: RuleBook) -> DecisionMade:
    usable = [m for m in memories if m.score >= MIN_MEMORY_SCORE and not m.must_confirm]
    if usable:
        best = usable[0]
        return DecisionMade(task_id, "planner", "reply", text=f"From what I remember: {best.content}",
                            arguments_json=_memory_sources([best]))
    return DecisionMade(task_id, "planner", "reply", text=book.template("unknown"),
                        arguments_json=_memory_sources([]))


DECISION_PROMPT = ("Decide the next step for the user's last message. Answer only with JSON matching: "
                   + json.dumps(DECISION_SCHEMA, separators=(",", ":")))


async def decide_open_question(task_id: str, context: list[dict[str, str]], memories: list[MemoryHit],
                               tools: list[ToolInfo], book: RuleBook, llm: DecisionMaker | None) -> Planned:
    """`context`: the messages the context builder made (DECISION_PROMPT first, memories under their anchors)."""
    if llm is None:
        return Planned(_planner(task_id, memories, book))
    messages = [*context[:1], *_agents_message(book), *context[1:]]
    problems: list[str] = []
    for _attempt in range(2):  # an invalid decision is retried once
        try:
            raw = await llm.decide(messages, tools)
        except OSError as exc:  # the endpoint failed: asking again now would fail the same way
            problems.append(f"the model did not answer: {exc}")
            break
        except ValueError as exc:  # an answer that holds no decision: malformed, retried like an invalid one
            raw, problem = None, f"no decision in the answer: {exc}"
        else:
            problem = _problem(raw, tools, book)
        if problem is None:
            return Planned(_llm_decision(task_id, raw, memories), tuple(problems))
        problems.append(problem)
        messages.append({"role": "user", "content": f"That decision was invalid ({problem}); answer again."})
    log.info("llm decision refused, planner decides", problems=problems)
    return Planned(_planner(task_id, memories, book), tuple(problems))
