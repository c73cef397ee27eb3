"""The yes/no of "shall I use this remembered value?", in Chinese and English, and its rules-file section."""

from __future__ import annotations

import pytest

from services.orchestrator.adapters.rules_file import DEFAULT_RULES
from services.orchestrator.domain.confirm import DEFAULT_CONFIRM
from services.orchestrator.domain.rulebook import RulesError, parse_rulebook

BOOK = parse_rulebook(DEFAULT_RULES.read_text(encoding="utf-8"))

LABELLED = [
    ("yes", "yes"), ("Yes, please.", "yes"), ("yep", "yes"), ("sure!", "yes"), ("that's right", "yes"),
    ("OK", "yes"), ("go ahead", "yes"), ("是", "yes"), ("是的", "yes"), ("对的。", "yes"), ("好的，用吧", "yes"),
    ("没错", "yes"), ("可以", "yes"),
    ("no", "no"), ("No.", "no"), ("nope", "no"), ("not that one", "no"), ("wrong", "no"), ("不", "no"),
    ("不是", "no"), ("不是的", "no"), ("不对！", "no"), ("错了，不是这个", "no"), ("不用", "no"), ("换一个", "no"),
    ("nobody knows", None), ("yesterday", None), ("it is B54321", None), ("hmm, let me think", None),
    ("对不起", None), ("是什么", None), ("", None),
]


@pytest.mark.parametrize(("text", "kind"), LABELLED)
def test_answers_are_told_apart_in_both_languages(text: str, kind: str | None) -> None:
    assert BOOK.confirm.classify(text) == kind


def test_the_rules_file_carries_the_default_phrases() -> None:
    assert set(BOOK.confirm.yes) == set(DEFAULT_CONFIRM.yes) and set(BOOK.confirm.no) == set(DEFAULT_CONFIRM.no)


def test_phrases_come_from_the_rules_file() -> None:
    book = parse_rulebook("confirm:\n  accept: [affirmative]\n  refuse: [negative]\n")
    assert (book.confirm.classify("Affirmative."), book.confirm.classify("negative"), book.confirm.classify("yes")) \
        == ("yes", "no", None)


@pytest.mark.parametrize(("text", "line", "reason"), [
    ("confirm:\n  yes: [sure]\n", 2, "keys must be text, not True"),
    ("confirm:\n  accept: [sure]\n  maybe: [hm]\n", 3, "confirm has only accept and refuse, not 'maybe'"),
    ("confirm:\n  accept: [sure, '']\n", 2, "every item of 'accept' must be non-empty text"),
])
def test_a_bad_confirm_section_is_refused_with_its_line_and_reason(text: str, line: int, reason: str) -> None:
    with pytest.raises(RulesError) as refused:
        parse_rulebook(text)
    assert (refused.value.line, refused.value.reason) == (line, reason)
