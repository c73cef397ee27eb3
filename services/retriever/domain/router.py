"""The memory router: a natural request goes to the structured path, the semantic path, or both.

Rules, in Chinese and English alike, over what the tenant's memories actually hold (the
vocabulary: entity keys, attribute names and their short text values):
- a memory id (a UUID) -> memory_id eq;
- an entity key of the tenant named in the request (user.budget) -> key eq;
- an attribute compared with a number, by symbol (amount > 500, 金额>=500) or in words (amount over 500,
  at least, less than; 金额大于500, 超过, 不少于, 低于) -> attributes.<name> gt/gte/lt/lte/eq;
- an attribute name followed by one of its known values (customer Acme, 客户华为) -> attributes.<name> eq.
No condition: semantic. Conditions and nothing else worth searching for: structured. Conditions and
other content words (what the memory says): both. Nothing here is tuned to a dataset: the names and
values come from the tenant's own memories.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from services.retriever.domain.sparse import terms
from services.retriever.domain.structured import ATTRIBUTE_PREFIX, Condition

__all__ = ["Route", "Vocabulary", "route"]

_UUID = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
_NUMBER = r"[-+]?[$¥€£]?\s*(\d[\d,]*(?:\.\d+)?)"
# Comparators, longest first within each language so "at least" wins over "least".
_WORDS = {
    "gte": ["at least", "no less than", "not less than", ">=", "≥", "不少于", "不低于", "不小于", "至少", "大于等于"],
    "lte": ["at most", "no more than", "not more than", "<=", "≤", "不超过", "不高于", "不大于", "至多", "最多", "小于等于"],
    "gt": ["more than", "greater than", "higher than", "larger than", "bigger than", "over", "above", "exceeding",
           "exceeds", "exceed", ">", "大于", "超过", "高于", "多于", "超出"],
    "lt": ["less than", "lower than", "smaller than", "fewer than", "under", "below", "<", "小于", "低于", "少于",
           "不到", "不足"],
    "eq": ["equal to", "equals", "==", "=", "等于"],
    "ne": ["not equal to", "!=", "≠", "不等于"],
}
_COMPARATOR = sorted(((w, op) for op, ws in _WORDS.items() for w in ws), key=lambda p: -len(p[0]))
# Words that ask for memories rather than describe them: they alone do not call for the semantic path.
_REQUEST_WORDS = frozenset(
    "find show list give get fetch every all memory memories record records entry entries whose with where has"
    " having mention mentioned".split()
) | frozenset("找 找出 查找 查询 列出 显示 给 所有 全部 每条 记忆 记录 条目 其中 相关 有关".split())
_LINK = r"[\s:：=是为的]{0,3}"  # between a name and its value: "customer Acme", "客户：华为", "客户是华为"


@dataclass(frozen=True)
class Vocabulary:
    """What the tenant's memories hold: entity keys, attribute paths (dotted), short text values per path."""

    keys: frozenset[str] = frozenset()
    attributes: frozenset[str] = frozenset()
    values: dict[str, frozenset[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Route:
    path: str  # structured | semantic | both
    conditions: tuple[Condition, ...] = ()
    rest: str = ""  # the request without what became conditions: what the semantic path searches for


def _name_pattern(name: str) -> str:
    """A name as it may appear: case-insensitive, its dots or underscores possibly written as spaces."""
    parts = [re.escape(p) for p in re.split(r"[._]", name) if p]
    return r"[\s._]?".join(parts)


def _bounded(pattern: str) -> str:
    """Latin names must stand as words (amount, not paramount); CJK has no word boundaries to ask for."""
    return rf"(?<![A-Za-z0-9_]){pattern}(?![A-Za-z0-9_])"


def route(text: str, vocabulary: Vocabulary) -> Route:
    conditions: list[Condition] = []
    spans: list[tuple[int, int]] = []

    def take(m: re.Match, condition: Condition, start: int | None = None) -> None:
        conditions.append(condition)
        spans.append((m.start() if start is None else start, m.end()))

    for m in _UUID.finditer(text):
        take(m, Condition("memory_id", "eq", m.group(0).lower()))
    for key in sorted(vocabulary.keys, key=len, reverse=True):
        for m in re.finditer(_bounded(_name_pattern(key)), text, re.IGNORECASE):
            if not _overlaps(spans, m.start(), m.end()):
                take(m, Condition("key", "eq", key))
    names = sorted(vocabulary.attributes, key=len, reverse=True)
    for name in names:
        name_re = _bounded(_name_pattern(name))
        for word, op in _COMPARATOR:
            pattern = rf"({name_re})\s*(?:is\s+|was\s+|为|是)?{re.escape(word)}\s*{_NUMBER}"
            for m in re.finditer(pattern, text, re.IGNORECASE):
                if not _overlaps(spans, m.start(), m.end()):
                    number = float(m.group(2).replace(",", ""))
                    take(m, Condition(ATTRIBUTE_PREFIX + name, op, int(number) if number.is_integer() else number))
        for value in sorted(vocabulary.values.get(name, ()), key=len, reverse=True):
            pattern = rf"({name_re}){_LINK}{_bounded(re.escape(value))}"
            for m in re.finditer(pattern, text, re.IGNORECASE):
                if not _overlaps(spans, m.start(), m.end()):
                    take(m, Condition(ATTRIBUTE_PREFIX + name, "eq", value))
    if not conditions:
        return Route("semantic", rest=text)
    rest = text
    for start, end in sorted(spans, reverse=True):
        rest = rest[:start] + " " + rest[end:]
    rest = " ".join(rest.split())
    described = [t for t in terms(rest) if t not in _REQUEST_WORDS and not t.isdigit()]
    return Route("both" if described else "structured", tuple(conditions), rest if described else "")


def _overlaps(spans: list[tuple[int, int]], start: int, end: int) -> bool:
    return any(start < e and s < end for s, e in spans)
