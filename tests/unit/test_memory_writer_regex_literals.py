"""The literal gate of the guard's features (domain/_regex_literals.py): a pattern's required literals are in every
match it makes, so a text holding none of them is spared the scan with no verdict changed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from services.memory_writer.domain import _guard_lexicon as lex
from services.memory_writer.domain import guard
from services.memory_writer.domain._regex_literals import gate_of, may_match, required_literals

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.mark.parametrize(("pattern", "literals"), [
    (r"\byou(?:'re| are) now\b", (" now",)),  # the longest run wins
    (r"(?:ignore|disregard) (?:the )?rules", ("disregard", "ignore")),  # "rules" alone is shorter
    (r"(?:ignore|disregard)(?:\s+\w+)?", ("disregard", "ignore")),
    (r"忽略(?:之前的)?指令|无视规则", ("无视规则", "忽略")),
    (r"(?:the )?\w+", None),  # nothing required
    (r"(?i)ignore", None),  # case-insensitive: its literals are not the text's
    (r"a(?:bc)+d", ("bc",)),
])
def test_the_literals_a_pattern_cannot_match_without(pattern: str, literals: tuple[str, ...] | None) -> None:
    assert required_literals(re.compile(pattern)) == literals


def test_a_gate_says_no_only_for_text_without_any_required_literal() -> None:
    gate = gate_of(re.compile(r"(?:ignore|disregard) (?:all )?(?:previous )?instructions"))
    assert may_match(gate, "the instructions are on the box") and not may_match(gate, "ignore the previous email")
    assert may_match(None, "anything")


def _texts() -> list[str]:
    texts = []
    for path in sorted(DATA.glob("*.jsonl")):
        texts += [json.loads(line).get("text", "") for line in path.read_text(encoding="utf-8").splitlines() if line]
    return [t for t in texts if t]


def test_every_match_of_every_feature_holds_one_of_its_gates_literals_so_no_verdict_changes() -> None:
    texts = _texts()
    assert len(texts) > 500
    for name, pattern in lex.FEATURES.items():
        literals = required_literals(pattern)
        for text in texts:
            for match in (pattern.finditer(text.lower()) if literals else ()):
                assert any(literal in match.group(0) for literal in literals), (name, match.group(0))
    gated = [guard.findings(t) for t in texts]
    saved = dict(lex.GATES)
    try:
        lex.GATES.update(dict.fromkeys(saved))
        assert [guard.findings(t) for t in texts] == gated
    finally:
        lex.GATES.update(saved)
