"""The interrupt detector on a labelled set, Chinese and English: precision and recall per kind."""

from __future__ import annotations

import pytest

from services.orchestrator.domain.interrupts import InterruptDetector

# (message, expected kind or "none", a redirect's new request)
LABELLED = [
    ("wait", "soft", ""), ("Wait!", "soft", ""), ("hold on", "soft", ""), ("hold on please", "soft", ""),
    ("hang on a sec", "soft", ""), ("one moment", "soft", ""), ("please wait", "soft", ""), ("ok, wait", "soft", ""),
    ("pause", "soft", ""), ("等一下", "soft", ""), ("等等", "soft", ""), ("稍等", "soft", ""), ("等一下啊", "soft", ""),
    ("请稍等", "soft", ""), ("暂停", "soft", ""),
    ("cancel", "hard", ""), ("Cancel.", "hard", ""), ("cancel that", "hard", ""), ("stop", "hard", ""),
    ("stop it please", "hard", ""), ("forget it", "hard", ""), ("never mind", "hard", ""), ("ok forget it", "hard", ""),
    ("abort!", "hard", ""), ("算了", "hard", ""), ("算了吧", "hard", ""), ("算了算了", "hard", ""), ("取消", "hard", ""),
    ("不用了", "hard", ""), ("别查了", "hard", ""), ("wait, cancel", "hard", ""), ("等一下，算了", "hard", ""),
    ("continue", "resume", ""), ("go on", "resume", ""), ("继续", "resume", ""), ("继续吧", "resume", ""),
    ("wait, check the invoice instead", "redirect", "check the invoice"),
    ("不对，先查发票", "redirect", "先查发票"), ("等一下，先查发票", "redirect", "先查发票"),
    ("actually, check order A12345", "redirect", "check order A12345"),
    ("actually check my invoice", "redirect", "check my invoice"),
    ("no, I meant the invoice", "redirect", "I meant the invoice"),
    ("check the invoice instead", "redirect", "check the invoice"),
    ("cancel that, look up my invoice", "redirect", "look up my invoice"),
    ("算了，查一下快递", "redirect", "查一下快递"), ("换成，查发票", "redirect", "查发票"),
    ("其实，我想查订单", "redirect", "我想查订单"),
    # ordinary requests that merely contain an interrupt word
    ("cancel my subscription", "none", ""), ("I can't wait for my order", "none", ""),
    ("where is my order?", "none", ""), ("取消订单", "none", ""), ("stop sending me emails", "none", ""),
    ("wait times at the store?", "none", ""), ("please continue the subscription next month", "none", ""),
    ("我想取消会员", "none", ""), ("继续购买需要什么", "none", ""), ("how do I pause my plan", "none", ""),
    ("no", "none", ""), ("不对", "none", ""), ("actually", "none", ""), ("hello", "none", ""),
    ("status of order A12345", "none", ""), ("我要退款", "none", ""), ("the order got stuck, can you check", "none", ""),
    ("forget my address", "none", ""), ("stop watch battery question", "none", ""), ("等我一下再发", "none", ""),
    ("wait a minute, that's wrong", "redirect", "that's wrong"), ("请取消订单", "none", ""),
    ("hold up", "soft", ""), ("停一下", "soft", ""), ("no no no, the other order", "redirect", "the other order"),
]
KINDS = ("soft", "hard", "resume", "redirect")
# Labelled honestly and missed by the detector (a stuttered opener); they count against recall.
KNOWN_MISSES = {"no no no, the other order"}


def _scores() -> dict[str, tuple[float, float]]:
    detector = InterruptDetector()
    got = [(expected, (found.kind if (found := detector.detect(text)) else "none"))
           for text, expected, _ in LABELLED]
    scores = {}
    for kind in KINDS:
        tp = sum(1 for e, g in got if e == kind and g == kind)
        predicted = sum(1 for _, g in got if g == kind)
        actual = sum(1 for e, _ in got if e == kind)
        scores[kind] = (tp / predicted if predicted else 1.0, tp / actual if actual else 1.0)
    return scores


def test_the_labelled_set_has_both_languages_and_every_kind() -> None:
    assert len(LABELLED) >= 60
    assert any(any("\u4e00" <= c <= "\u9fff" for c in t) for t, _, _ in LABELLED)
    assert {k for _, k, _ in LABELLED} == {*KINDS, "none"}


@pytest.mark.parametrize("kind", KINDS)
def test_precision_and_recall_per_kind_are_at_least_ninety_percent(kind: str) -> None:
    precision, recall = _scores()[kind]
    print(f"{kind}: precision {precision:.2f} recall {recall:.2f}")
    assert precision >= 0.9 and recall >= 0.9, (kind, precision, recall)


@pytest.mark.parametrize(("text", "rest"), [(t, r) for t, k, r in LABELLED
                                            if k == "redirect" and t not in KNOWN_MISSES])
def test_a_redirect_carries_the_new_request(text: str, rest: str) -> None:
    assert InterruptDetector().detect(text).rest == rest
