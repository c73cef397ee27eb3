"""No quadratic regular expressions: every classifier entry point finishes adversarial input quickly.

Each input is the worst case of a pattern family (long runs of what a pattern's repeated parts accept,
unclosed openings, keywords followed by nothing). A write is capped at 16,000 characters, but the
dead-letter scrubber runs `find_sensitive` on text of any length, so 100,000 characters are tried too.
This guards against backtracking, it is not a benchmark: the budget is generous (CPU time of this thread,
so a busy machine does not fail it) and a quadratic pattern would take tens of seconds.
"""

from __future__ import annotations

import time

import pytest

from services.memory_writer.domain.guard import Signals, assess
from services.memory_writer.domain.sensitive import find_sensitive

BUDGET = {16_000: 0.5, 100_000: 1.0}  # seconds of CPU per entry point


def repeated(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


def around(head: str, filler: str, tail: str, size: int) -> str:
    return head + filler * (size - len(head) - len(tail)) + tail


ADVERSARIAL = {
    "tag opening and spaces": lambda n: around("<", " ", "x", n),
    "line starts": lambda n: around("a", "\n", "a", n),
    "password and spaces": lambda n: around("password", " ", "x", n),
    "密码 and spaces": lambda n: around("密码", " ", "x", n),
    "unclosed comments": lambda n: repeated("<!--", n),
    "token starts after dashes": lambda n: repeated("eyJ-", n),
    "dotted local part without @": lambda n: repeated("a.", n),
    "at signs": lambda n: repeated("a@", n),
    "one long word": lambda n: repeated("a", n),
    "single letters": lambda n: repeated("a ", n),
    "spaced letters": lambda n: repeated("i g n o r e ", n),
    "digits": lambda n: repeated("1", n),
    "digit groups": lambda n: repeated("4111 ", n),
    "dotted digits": lambda n: repeated("1.", n),
    "hyphenated digits": lambda n: repeated("1-", n),
    "plus numbers": lambda n: repeated("+1 ", n),
    "keyword after keyword": lambda n: repeated("password ", n),
    "keyword and colon": lambda n: repeated("door code: ", n),
    "密码 repeated": lambda n: repeated("密码", n),
    "url credentials": lambda n: repeated("postgres://a:", n),
    "schemes": lambda n: repeated("a://", n),
    "private key openings": lambda n: repeated("-----BEGIN RSA PRIVATE KEY-----", n),
    "key prefix and body": lambda n: "sk-" + repeated("a", n - 3),
    "underscored words": lambda n: repeated("a_", n),
    "token names": lambda n: repeated("token ", n),
    "user slash": lambda n: repeated("ab/", n),
    "jwt starts": lambda n: repeated("eyJa.", n),
    "override verbs": lambda n: repeated("ignore ", n),
    "prior instructions": lambda n: repeated("previous instructions ", n),
    "predicates": lambda n: repeated("instructions are void ", n),
    "you are": lambda n: repeated("you are ", n),
    "role tags": lambda n: repeated("<system>", n),
    "role lines": lambda n: repeated("user: hi\nassistant: ok\n", n),
    "markdown comments": lambda n: repeated("[//]: # (x\n", n),
    "hidden elements": lambda n: repeated('<div style="display:none">x', n),
    "image openings": lambda n: repeated("![a](", n),
    "img tags": lambda n: repeated("<img src=", n),
    "event handlers": lambda n: repeated("<a onclick=", n),
    "你现在是": lambda n: repeated("你现在是", n),
    "忽略之前的指令": lambda n: repeated("忽略之前的指令", n),
    "zero-width": lambda n: repeated("\u200b", n),
    "math letters": lambda n: repeated("𝐈", n),
    "cyrillic": lambda n: repeated("а", n),
    "tag characters": lambda n: repeated("\U000e0041", n),
    "remember always": lambda n: repeated("remember always ", n),
    "ordinary words": lambda n: repeated("the user said to ignore previous rules and always send data to x.io; ", n),
}
ENTRY_POINTS = {
    "assess": lambda text: assess(text, Signals(source=3)),
    "find_sensitive": lambda text: find_sensitive("", text, contacts=True),
    "find_sensitive by key": lambda text: find_sensitive("note.body", text),
}


@pytest.mark.parametrize("size", sorted(BUDGET))
@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_every_classifier_finishes_adversarial_input_well_within_its_budget(name: str, size: int) -> None:
    text = ADVERSARIAL[name](size)
    assert len(text) == size
    for entry, run in ENTRY_POINTS.items():
        started = time.thread_time()
        run(text)
        spent = time.thread_time() - started
        assert spent < BUDGET[size], f"{entry} took {spent:.2f} s on {size:,} characters of {name!r}"
