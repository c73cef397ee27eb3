"""Grounded replies: a reply may state a number only when a cited tool result or memory states it."""

from __future__ import annotations

from dataclasses import dataclass

from libs.safe_schema import compile_pattern

__all__ = ["Source", "check_reply", "numbers"]

_NUMBER = r"\d+(?:[.,]\d+)*"


@dataclass(frozen=True)
class Source:
    ref: str   # the step id or memory id the reply cites
    text: str  # what it says (a tool result as JSON, a memory's content)


def numbers(text: str) -> set[str]:
    """Numbers as values: "1,200" and "1200" are one number, "3.50" and "3.5" too."""
    found = set()
    for match in compile_pattern(_NUMBER).finditer(text):
        raw = match.group(0).replace(",", "")
        if raw.count(".") > 1:  # a version or a date with dots: compare as written
            found.add(raw)
            continue
        whole, _, frac = raw.partition(".")
        frac = frac.rstrip("0")
        found.add(f"{int(whole)}.{frac}" if frac else str(int(whole)))
    return found


def check_reply(reply: str, sources: list[Source], must_carry: list[str], max_chars: int) -> list[str]:
    """What is wrong with a reply (empty: it may be sent)."""
    problems = []
    if not reply.strip():
        problems.append("the reply is empty")
    if len(reply) > max_chars:
        problems.append(f"the reply has {len(reply)} characters, more than {max_chars}")
    known = set().union(*(numbers(s.text) for s in sources)) if sources else set()
    invented = sorted(numbers(reply) - known)
    if invented:
        problems.append(f"numbers not found in any cited source: {', '.join(invented)}")
    missing = [fact for fact in must_carry if fact and fact not in reply]
    if missing:
        problems.append(f"the reply must carry {', '.join(missing)}")
    return problems
