"""The rule book: interrupt phrases, rules, intents with slots, reply templates — one YAML file.

Rules are tried top to bottom and the first match wins; a rule is a keyword list (whole words
for Latin script, substrings for Chinese) and/or an RE2 regular expression (linear time).
Actions: `human` (hand over), `block` (risk block: nothing else runs), `tool` (an intent whose
tool is called once its slots are filled), `reply` (a fixed answer), `delegate` (hand the request to
another agent declared under `agents`, with the outcome expected of it and the compensation to run
when it does not deliver it). A file that does not parse
or names something wrong is refused with its line and the reason (`RulesError`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import yaml

from libs.safe_schema import UnsupportedPattern, compile_pattern
from services.orchestrator.domain.confirm import DEFAULT_CONFIRM, ConfirmPhrases
from services.orchestrator.domain.interrupts import DEFAULT_PHRASES, Phrases
from services.orchestrator.domain.slots import VALIDATORS, SlotValidator, pattern_validator

__all__ = ["AgentSpec", "Intent", "Rule", "RuleBook", "RulesError", "SlotSpec", "parse_rulebook"]

ACTIONS = ("human", "block", "tool", "reply", "delegate")
_MAX_RULES = 1_000


class RulesError(ValueError):
    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line, self.reason = line, reason


@dataclass(frozen=True)
class SlotSpec:
    name: str
    validator: SlotValidator
    question: str
    memory_key: str = ""  # look the value up in memory under this entity key (L1: used; L2: offered to confirm)


@dataclass(frozen=True)
class Intent:
    name: str
    tool: str
    slots: tuple[SlotSpec, ...]
    arguments: dict[str, str]   # tool argument -> template over the slots
    reply: str                  # template over the slots and the tool result's fields
    must_carry: tuple[str, ...] = ()  # result fields whose values the reply must state
    verify_field: str = ""      # closed loop: the result is verified when this field is present and truthy


@dataclass(frozen=True)
class AgentSpec:
    """Another agent the orchestrator may delegate to (A2A), what it must deliver, and the compensation."""

    name: str
    url: str                                  # its A2A base URL (the card is at /.well-known/agent-card.json)
    description: str = ""
    text: str = "{message}"                   # what it is asked: {message} the user's words, {rest} without the
                                              # words that matched the rule
    expect_state: str = "IDLE"                # the callee's session state after its turn
    reply_contains: tuple[str, ...] = ()      # facts its reply must carry
    compensation_tool: str = ""               # run through the gateway when the outcome does not match
    compensation_arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Rule:
    name: str
    action: str
    line: int
    intent: str = ""
    reply: str = ""
    keywords: tuple[str, ...] = ()
    regex: str = ""
    agent: str = ""

    def matches(self, text: str) -> bool:
        return any(compile_pattern(p).search(text) is not None for p in self._patterns())

    def rest(self, text: str) -> str:
        """The message without the first words that matched this rule (what a delegation passes on)."""
        for pattern in self._patterns():
            found = compile_pattern(pattern).search(text)
            if found is not None:
                return (text[:found.start()] + " " + text[found.end():]).strip(" ,，:：;；-") or text
        return text

    def _patterns(self) -> list[str]:
        patterns = [self.regex] if self.regex else []
        if self.keywords:
            words = "|".join(_keyword(k) for k in self.keywords)
            patterns.append(f"(?i)(?:{words})")
        return patterns


def _keyword(word: str) -> str:
    escaped = "".join(c if c.isalnum() or c == " " else "\\" + c for c in word)
    if word.isascii():
        return rf"\b{escaped}\b"
    return escaped


@dataclass(frozen=True)
class RuleBook:
    phrases: Phrases = DEFAULT_PHRASES
    rules: tuple[Rule, ...] = ()
    intents: dict[str, Intent] = field(default_factory=dict)
    templates: dict[str, str] = field(default_factory=dict)
    max_reply_chars: int = 1_000
    confirm: ConfirmPhrases = DEFAULT_CONFIRM
    agents: dict[str, AgentSpec] = field(default_factory=dict)

    def match(self, text: str) -> Rule | None:
        return next((r for r in self.rules if r.matches(text)), None)

    def template(self, name: str) -> str:
        return self.templates.get(name, _TEMPLATES[name])


_TEMPLATES = {
    "human": "I am handing this over to a colleague; a person will answer you here shortly.",
    "block": "For your safety I cannot process identity or card numbers in chat. Please remove them.",
    "unknown": "I could not find anything about that. Could you say it differently?",
    "failed": "The tool did not answer after three tries; a colleague will take over.",
    "not_retried": "I could not complete this, and it is not safe to try again on my own; a colleague will "
                   "check what happened and take over.",
    "ungrounded": "Here is what the tool returned: {result}",
    "confirm_slot": "I have {value} on record as your {slot}. Shall I use it? (yes / no)",
    "confirm_again": "Please answer yes or no: shall I use {value} as your {slot}?",
    "delegation_failed": "The {agent} agent did not do what was expected ({reason}), so I undid it with {tool}.",
    "delegation_unsettled": "The {agent} agent could not be checked or undone; a colleague will take over.",
}


# --- parsing with line numbers -----------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    pass


class _Map(dict):
    line = 0
    lines: dict[str, int]


class _List(list):
    line = 0
    lines: list[int]


def _mapping(loader: _Loader, node: yaml.MappingNode) -> _Map:
    out = _Map()
    out.line, out.lines = node.start_mark.line + 1, {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            raise RulesError(key_node.start_mark.line + 1, f"keys must be text, not {key!r}")
        if key in out:
            raise RulesError(key_node.start_mark.line + 1, f"{key!r} appears twice")
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = value_node.start_mark.line + 1
    return out


def _sequence(loader: _Loader, node: yaml.SequenceNode) -> _List:
    out = _List(loader.construct_object(item, deep=True) for item in node.value)
    out.line, out.lines = node.start_mark.line + 1, [item.start_mark.line + 1 for item in node.value]
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _sequence)


def _get(node: _Map, key: str, kind: type, default: Any = None, required: bool = False) -> Any:
    if key not in node:
        if required:
            raise RulesError(node.line, f"{key!r} is required")
        return default
    value = node[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise RulesError(node.lines[key], f"{key!r} must be {kind.__name__}, not {type(value).__name__}")
    return value


def _texts(node: _Map, key: str) -> tuple[str, ...]:
    items = _get(node, key, list, [])
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item.strip():
            raise RulesError(items.lines[i], f"every item of {key!r} must be non-empty text")
    return tuple(items)


def _pattern(text: str, line: int, what: str) -> str:
    try:
        compile_pattern(text)
    except UnsupportedPattern as exc:
        raise RulesError(line, f"{what}: {exc}") from None
    return text


def parse_rulebook(text: str) -> RuleBook:
    try:
        root = yaml.load(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise RulesError(mark.line + 1 if mark else 1, f"not valid YAML: {exc.problem}") from None
    if not isinstance(root, _Map):
        raise RulesError(1, "the file must be a mapping with interrupts, rules, intents and templates")
    unknown = set(root) - {"interrupts", "confirm", "agents", "rules", "intents", "templates", "max_reply_chars"}
    if unknown:
        key = min(unknown)
        raise RulesError(root.lines[key], f"unknown section {key!r}")
    phrases = DEFAULT_PHRASES
    if "interrupts" in root:
        node = _get(root, "interrupts", dict)
        phrases = Phrases(**{k: _texts(node, k) or getattr(DEFAULT_PHRASES, k)
                             for k in ("soft", "hard", "resume", "redirect", "fillers")})
    confirm = DEFAULT_CONFIRM
    if "confirm" in root:
        node = _get(root, "confirm", dict)
        extra = set(node) - {"accept", "refuse"}
        if extra:
            raise RulesError(node.lines[min(extra)], f"confirm has only accept and refuse, not {min(extra)!r}")
        confirm = ConfirmPhrases(_texts(node, "accept") or DEFAULT_CONFIRM.yes,
                                 _texts(node, "refuse") or DEFAULT_CONFIRM.no)
    intents = {name: _intent(name, node, root["intents"].lines[name])
               for name, node in _get(root, "intents", dict, _Map()).items()}
    agents = {name: _agent(name, node, root["agents"].lines[name])
              for name, node in _get(root, "agents", dict, _Map()).items()}
    rules = tuple(_rule(node, line, intents, agents) for node, line in _rules(root))
    templates = _get(root, "templates", dict, _Map())
    for name, value in templates.items():
        if name not in _TEMPLATES or not isinstance(value, str):
            raise RulesError(templates.lines[name], f"template {name!r} must be one of {sorted(_TEMPLATES)}, as text")
    max_chars = _get(root, "max_reply_chars", int, 1_000)
    return RuleBook(phrases, rules, intents, dict(templates), max_chars, confirm, agents)


def _rules(root: _Map) -> list[tuple[_Map, int]]:
    items = _get(root, "rules", list, _List())
    if not items:  # no rules (a file of phrases and templates only)
        return []
    if len(items) > _MAX_RULES:
        raise RulesError(items.line, f"at most {_MAX_RULES} rules")
    for i, item in enumerate(items):
        if not isinstance(item, _Map):
            raise RulesError(items.lines[i], "a rule is a mapping with name, action and keywords or regex")
    return list(zip(items, items.lines, strict=True))


def _rule(node: _Map, line: int, intents: dict[str, Intent], agents: dict[str, AgentSpec]) -> Rule:
    name = _get(node, "name", str, required=True)
    action = _get(node, "action", str, required=True)
    if action not in ACTIONS:
        raise RulesError(node.lines["action"], f"action {action!r} must be one of {', '.join(ACTIONS)}")
    keywords = _texts(node, "keywords")
    regex = _get(node, "regex", str, "")
    if regex:
        _pattern(regex, node.lines["regex"], f"rule {name!r} regex")
    if not keywords and not regex:
        raise RulesError(line, f"rule {name!r} needs keywords or a regex")
    intent = _get(node, "intent", str, "")
    if action == "tool" and intent not in intents:
        raise RulesError(node.lines.get("intent", line), f"rule {name!r}: intent {intent!r} is not declared under intents")
    reply = _get(node, "reply", str, "")
    if action == "reply" and not reply:
        raise RulesError(line, f"rule {name!r}: a reply rule needs its reply")
    agent = _get(node, "agent", str, "")
    if action == "delegate" and agent not in agents:
        raise RulesError(node.lines.get("agent", line), f"rule {name!r}: agent {agent!r} is not declared under agents")
    return Rule(name, action, line, intent, reply, keywords, regex, agent)


def _agent(name: str, node: Any, line: int) -> AgentSpec:
    if not isinstance(node, _Map):
        raise RulesError(line, f"agent {name!r} must be a mapping with url, expect and compensation")
    url = _get(node, "url", str, required=True)
    if not url.startswith(("http://", "https://")):
        raise RulesError(node.lines["url"], f"agent {name!r}: url must be the agent's A2A URL (http:// or https://)")
    text = _get(node, "text", str, "{message}")
    expect = _get(node, "expect", dict, _Map())
    extra = set(expect) - {"state", "reply_contains"}
    if extra:
        raise RulesError(expect.lines[min(extra)],
                         f"agent {name!r}: expect has state and reply_contains, not {min(extra)!r}")
    compensation = _get(node, "compensation", dict, None)
    if compensation is None:
        raise RulesError(line, f"agent {name!r}: a delegation declares its compensation (tool and arguments), "
                               "run when the agent does not deliver what is expected")
    arguments = _get(compensation, "arguments", dict, _Map())
    return AgentSpec(name, url, _get(node, "description", str, ""), text, _get(expect, "state", str, "IDLE"),
                     _texts(expect, "reply_contains"), _get(compensation, "tool", str, required=True),
                     dict(arguments))


def _intent(name: str, node: Any, line: int) -> Intent:
    if not isinstance(node, _Map):
        raise RulesError(line, f"intent {name!r} must be a mapping with tool, slots and reply")
    tool = _get(node, "tool", str, required=True)
    slots = []
    for slot_name, spec in _get(node, "slots", dict, _Map()).items():
        slot_line = node["slots"].lines[slot_name]
        if not isinstance(spec, _Map):
            raise RulesError(slot_line, f"slot {slot_name!r} must be a mapping with validator and question")
        slots.append(_slot(slot_name, spec))
    arguments = _get(node, "arguments", dict, _Map())
    for key, value in arguments.items():
        if not isinstance(value, str):
            raise RulesError(arguments.lines[key], f"argument {key!r} must be a template text such as '{{order_id}}'")
    reply = _get(node, "reply", str, required=True)
    try:
        json.dumps(dict(arguments))
    except (TypeError, ValueError) as exc:
        raise RulesError(node.line, f"intent {name!r} arguments: {exc}") from None
    return Intent(name, tool, tuple(slots), dict(arguments), reply, _texts(node, "must_carry"),
                  _get(node, "verify_field", str, ""))


def _slot(name: str, spec: _Map) -> SlotSpec:
    validator_name = _get(spec, "validator", str, required=True)
    question = _get(spec, "question", str, required=True)
    if validator_name == "pattern":
        pattern = _pattern(_get(spec, "pattern", str, required=True), spec.lines["pattern"], f"slot {name!r}")
        validator = pattern_validator(name, pattern, _get(spec, "reason", str, f"{name} is not valid"))
    elif validator_name in VALIDATORS:
        validator = VALIDATORS[validator_name]
    else:
        raise RulesError(spec.lines["validator"],
                         f"validator {validator_name!r} must be one of pattern, {', '.join(sorted(VALIDATORS))}")
    return SlotSpec(name, validator, question, _get(spec, "memory_key", str, ""))
