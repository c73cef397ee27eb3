"""Compression of session history: when to compress, and the extractive summary (no I/O).

Triggers: the uncovered turns of a session reach `turns` (default 10), or their estimated tokens
reach `share` (default 65 %) of the context window. The extractive strategy keeps, in their
original order, the sentences that carry what an agent must not lose: numbers, dates and amounts,
decisions and requests, names and identifiers; then fills the budget with the rest by position.
Abstractive and hybrid strategies go through an LLM port (service layer); every summary lists the
turns it covers in `derived_from`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from libs.text import is_cjk

__all__ = ["Triggers", "Turn", "estimate_tokens", "extractive_summary", "should_compress"]

_SENTENCE = re.compile(r"[^。！？!?；;\n]+(?:[。！？!?；;]+|\n|$)|[^.\n]+(?:\.(?=\s|$)|\n|$)")
_NUMBER = re.compile(r"\d|[一二两三四五六七八九十百千万]+\s*(个|位|间|晚|天|次|人|元|块|岁|号|点|月|周|年|份|张)")
# Constraints an agent must never drop: health, allergies, prohibitions.
_CONSTRAINT = re.compile(r"(?i)\b(allerg\w*|diabet\w*|pregnan\w*|blood pressure|never|do not|don't|must not)\b|"
                         r"过敏|高血压|糖尿病|怀孕|空腹|禁止|不能|不要|忌")
_DECISION = re.compile(
    r"(?i)\b(decid\w*|agree\w*|confirm\w*|book\w*|cancel\w*|order\w*|choose|chose|pick\w*|will|want|need|must|"
    r"prefer\w*|please|remind\w*|schedule\w*|deadline|budget)\b|决定|确定|确认|预订|订|取消|选择|要|需要|希望|提醒|安排|截止|预算")
_ENTITY = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-z]+(?:\s[A-Z][a-z]+)*|@|\b[A-Z]{2,}\b|"
                     r"[\u4e00-\u9fff](总|先生|女士|经理|医生|老师|教授)|[\u4e00-\u9fff]{1,4}(公司|医院|大学|银行)")


@dataclass(frozen=True)
class Turn:
    memory_id: str
    role: str  # "user" or "assistant" (from the memory's tags), "" when unknown
    text: str


@dataclass(frozen=True)
class Triggers:
    turns: int = 10
    share: float = 0.65
    window_tokens: int = 8_000


def estimate_tokens(text: str) -> int:
    """A model-agnostic estimate: one token per CJK character, 1.3 per other word."""
    cjk = sum(1 for ch in text if is_cjk(ch))
    words = len(re.findall(r"[A-Za-z0-9]+", text))
    return cjk + int(words * 1.3 + 0.5)


def should_compress(turns: list[Turn], triggers: Triggers) -> str:
    """Which trigger fires ('turns' or 'tokens'), or '' when none does."""
    if len(turns) >= triggers.turns:
        return "turns"
    if sum(estimate_tokens(t.text) for t in turns) >= triggers.share * triggers.window_tokens:
        return "tokens"
    return ""


def _score(sentence: str, role: str) -> int:
    return (3 * bool(_NUMBER.search(sentence) or _CONSTRAINT.search(sentence))
            + 2 * bool(_DECISION.search(sentence) or _ENTITY.search(sentence)) + (role == "user"))


def extractive_summary(turns: list[Turn], budget_ratio: float = 0.4) -> str:
    """Key sentences of `turns`, in order, within about `budget_ratio` of their tokens (at least one
    sentence per turn that scored). Each kept sentence is prefixed by its speaker."""
    sentences = []  # (turn index, position, role, sentence, score)
    for i, turn in enumerate(turns):
        for j, m in enumerate(_SENTENCE.finditer(turn.text)):
            text = m.group(0).strip()
            if text:
                sentences.append((i, j, turn.role, text, _score(text, turn.role)))
    total = sum(estimate_tokens(s[3]) for s in sentences)
    budget = max(int(total * budget_ratio), 1)
    chosen, used = set(), 0
    for item in sorted(sentences, key=lambda s: (-s[4], s[0], s[1])):
        cost = estimate_tokens(item[3])
        if item[4] == 0 and used + cost > budget:
            continue
        if used + cost > budget and item[4] < 3:  # numbers, dates and amounts are kept whatever the budget
            continue
        chosen.add((item[0], item[1]))
        used += cost
    lines = []
    for i, j, role, text, _ in sentences:
        if (i, j) in chosen:
            lines.append(f"({role}) {text}" if role else text)  # not "user:", which reads as a chat transcript
    return "\n".join(lines)
