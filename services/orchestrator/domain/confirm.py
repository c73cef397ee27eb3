"""Yes or no: the user's answer to "shall I use this remembered value?", in Chinese and English.

An answer is "yes" or "no" when, after NFKC, case folding and trimming punctuation, it is one of the
phrases, or opens with one followed by a separator ("yes, use it", "不是，换一个"). The longest phrase
wins, so "不是" is a no although "是" is a yes. Anything else is neither: the question is asked again.
Phrases are configuration (the `confirm` section of the rules file).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

__all__ = ["DEFAULT_CONFIRM", "ConfirmPhrases"]

_SEPARATORS = " ,，.。!！?？;；:：~～、"


def _normal(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split()).strip(_SEPARATORS)


@dataclass(frozen=True)
class ConfirmPhrases:
    yes: tuple[str, ...]
    no: tuple[str, ...]

    def classify(self, text: str) -> str | None:
        """"yes", "no", or None when the answer is neither."""
        norm = _normal(text)
        phrases = sorted([(_normal(p), "yes") for p in self.yes] + [(_normal(p), "no") for p in self.no],
                         key=lambda item: -len(item[0]))
        for phrase, kind in phrases:
            if not phrase:
                continue
            if norm == phrase:
                return kind
            if norm.startswith(phrase) and norm[len(phrase)] in _SEPARATORS:
                return kind
        return None


DEFAULT_CONFIRM = ConfirmPhrases(
    yes=("yes", "y", "yeah", "yep", "yup", "sure", "correct", "right", "that's right", "that is right", "ok", "okay",
         "use it", "go ahead", "confirm", "confirmed", "yes please", "please do", "that's it", "that one",
         "是", "是的", "对", "对的", "好", "好的", "可以", "没错", "没问题", "确认", "用吧", "就是这个", "行"),
    no=("no", "n", "nope", "nah", "not that", "not that one", "wrong", "incorrect", "don't", "do not", "no thanks",
        "不", "不是", "不是的", "不对", "不用", "错了", "不要", "不行", "换一个", "不是这个"),
)
