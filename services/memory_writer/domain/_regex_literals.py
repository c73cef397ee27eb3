"""What text a regular expression cannot match without: a gate that spares a scan (no I/O).

`required_literals(pattern)` reads the pattern's parse tree for literal text every match must hold: a run of
literal characters outside anything optional, or, where the pattern branches, one such run per branch. A text
holding none of them cannot match, so the pattern need not scan it; a text holding one still must be scanned.
None when no literal is required (the pattern must always run). Case-insensitive parts give up (None): their
literals are not the text's.
"""

from __future__ import annotations

import re
import re._parser as sre_parse
from re._constants import ATOMIC_GROUP, BRANCH, LITERAL, MAX_REPEAT, MIN_REPEAT, POSSESSIVE_REPEAT, SUBPATTERN

__all__ = ["gate_of", "may_match", "required_literals"]


def required_literals(pattern: re.Pattern[str]) -> tuple[str, ...] | None:
    if pattern.flags & re.IGNORECASE:
        return None
    found = _required(sre_parse.parse(pattern.pattern, pattern.flags))
    return None if found is None else tuple(sorted(found, key=lambda s: (-len(s), s)))


def may_match(gate: re.Pattern[str] | None, text: str) -> bool:
    """False only when `text` holds none of a pattern's required literals (`gate`: them as one pattern, from
    `gate_of`): the pattern cannot match."""
    return gate is None or gate.search(text) is not None


def gate_of(pattern: re.Pattern[str]) -> re.Pattern[str] | None:
    """A pattern finding any of `pattern`'s required literals (None: it requires none, and must always run)."""
    literals = required_literals(pattern)
    return None if literals is None else re.compile("|".join(map(re.escape, literals)))


def _strength(literals: frozenset[str]) -> tuple[int, int]:
    """Longer literals, and fewer of them, rule out more texts."""
    return min(map(len, literals)), -len(literals)


def _required(items) -> frozenset[str] | None:
    best: frozenset[str] | None = None
    run: list[str] = []

    def consider(literals: frozenset[str] | None) -> None:
        nonlocal best
        if literals and (best is None or _strength(literals) > _strength(best)):
            best = literals

    for op, av in items:
        if op is LITERAL:
            run.append(chr(av))
            continue
        if run:
            consider(frozenset({"".join(run)}))
            run = []
        if op is SUBPATTERN:
            if not av[1] & re.IGNORECASE:  # (group, flags added, flags removed, the group's items)
                consider(_required(av[3]))
        elif op is BRANCH:  # one of the branches matches: each must require something
            branches = [_required(branch) for branch in av[1]]
            if all(branches):
                consider(frozenset().union(*branches))
        elif op in (MAX_REPEAT, MIN_REPEAT, POSSESSIVE_REPEAT):
            if av[0] >= 1:  # (min, max, item): at least once
                consider(_required(av[2]))
        elif op is ATOMIC_GROUP:
            consider(_required(av))
        # anything else (classes, any character, anchors, lookarounds, back-references) requires no literal
    if run:
        consider(frozenset({"".join(run)}))
    return best
