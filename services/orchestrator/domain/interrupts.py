"""The interrupt detector: soft pause, hard stop, resume and redirect, in Chinese and English.

Phrases are configuration (the rules file). A phrase interrupts only when it is the whole
message (give or take fillers such as "please", "ok", "吧") or when it opens the message and
is followed by a separator and a new request, which makes a redirect ("wait, check the invoice
instead", "不对，先查发票"). So "cancel" stops, but "cancel my subscription" and "I can't wait
for my order" are ordinary requests. A message ending with "instead" also redirects.
"""

from __future__ import annotations

import collections
import unicodedata
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["DEFAULT_PHRASES", "Interrupt", "InterruptDetector", "Kind", "Phrases"]

_SEPARATORS = ",，、;；:：.。!！?？—-…~～ \t\n"
_TRAILING = ".。!！?？…~～ \t\n,，"


class Kind(StrEnum):
    SOFT = "soft"
    HARD = "hard"
    RESUME = "resume"
    REDIRECT = "redirect"


@dataclass(frozen=True)
class Interrupt:
    kind: Kind
    phrase: str
    rest: str = ""  # a redirect's new request


@dataclass(frozen=True)
class Phrases:
    soft: tuple[str, ...]
    hard: tuple[str, ...]
    resume: tuple[str, ...]
    redirect: tuple[str, ...]  # open a redirect; alone they are no interrupt ("actually")
    fillers: tuple[str, ...] = ()
    suffixes: tuple[str, ...] = field(default=("instead",))  # "check the invoice instead"


DEFAULT_PHRASES = Phrases(
    soft=("wait", "hold on", "hang on", "one moment", "one sec", "just a moment", "pause", "no wait", "wait a sec",
          "wait a moment", "wait a minute", "hang on a sec", "hold on a sec", "hold up", "停一下",
          "等一下", "等等", "稍等", "先等等", "暂停", "等一会"),
    hard=("cancel", "cancel that", "cancel it", "stop", "stop it", "forget it", "never mind", "nevermind", "abort",
          "算了", "取消", "不用了", "别查了", "停下", "停", "不要了"),
    resume=("continue", "go on", "go ahead", "carry on", "resume", "继续", "接着来", "继续吧"),
    redirect=("actually", "no", "instead", "rather", "不对", "换成", "改成", "其实"),
    fillers=("please", "ok", "okay", "oh", "um", "uh", "just", "hey", "sorry", "请", "吧", "啊", "呀", "哦", "嗯"),
)


def _normal(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def _is_word_char(char: str) -> bool:
    return char.isalnum() and char.isascii()


class InterruptDetector:
    def __init__(self, phrases: Phrases = DEFAULT_PHRASES) -> None:
        self.phrases = phrases
        by_kind = [(Kind.HARD, phrases.hard), (Kind.SOFT, phrases.soft), (Kind.RESUME, phrases.resume)]
        self._whole = {_normal(p): (kind, p) for kind, items in reversed(by_kind) for p in items}
        # Longest first, so "hold on" is found before "hold" and "cancel that" before "cancel".
        openers = [(k, p) for k, items in [*by_kind, (Kind.REDIRECT, phrases.redirect)] for p in items]
        self._openers = sorted(((k, _normal(p)) for k, p in openers), key=lambda kp: -len(kp[1]))
        self._fillers = sorted({_normal(f) for f in phrases.fillers}, key=len, reverse=True)

    def detect(self, text: str) -> Interrupt | None:
        norm = _normal(text)
        whole = self._whole_match(norm)
        if whole is not None:
            return whole
        core = self._strip_fillers(norm)
        for kind, phrase in self._openers:
            if not core.startswith(phrase):
                continue
            after = core[len(phrase):]
            if not after or after[0] not in _SEPARATORS:
                continue
            if after[0].isspace() and not (kind == Kind.REDIRECT and len(phrase) > 2):
                continue  # "cancel my subscription", "wait for me": a space is not enough after these
            rest = self._drop_suffix(after.strip(_SEPARATORS))
            if not rest:
                continue
            inner = self._whole_match(rest)
            if inner is not None:  # "wait, cancel that": the stronger of the two
                return inner if inner.kind == Kind.HARD or kind != Kind.HARD else Interrupt(Kind.HARD, phrase)
            if kind == Kind.RESUME:
                return None  # "go on, check my order" is an ordinary request
            return Interrupt(Kind.REDIRECT, phrase, self._original_rest(text, rest))
        rest = self._drop_suffix(core)
        if rest != core.strip(_TRAILING):
            return Interrupt(Kind.REDIRECT, "instead", self._original_rest(text, rest))
        return None

    def _drop_suffix(self, core: str) -> str:
        trimmed = core.strip(_TRAILING)
        for suffix in self.phrases.suffixes:
            tail = _normal(suffix)
            if trimmed.endswith(" " + tail) and len(trimmed) > len(tail) + 1:
                return trimmed[: -len(tail)].strip(_SEPARATORS)
        return trimmed

    def _whole_match(self, norm: str) -> Interrupt | None:
        for core in self._variants(norm):
            found = self._whole.get(core)
            if found is not None:
                return Interrupt(found[0], found[1])
        core = self._strip_fillers(norm)
        # "cancel, cancel!" or "算了算了": one phrase repeated
        for phrase, (kind, original) in self._whole.items():
            if phrase in core and core.replace(phrase, " ").strip(_SEPARATORS) == "":
                return Interrupt(kind, original)
        return None

    def _variants(self, norm: str):
        """The message, then with one filler after another taken off either end."""
        core, changed = norm.strip(_TRAILING), True
        yield core
        while changed:
            changed = False
            for filler in self._fillers:
                for cut in (self._cut_start, self._cut_end):
                    shorter = cut(core, filler)
                    if shorter is not None and shorter != core:
                        core, changed = shorter, True
                        yield core

    def _strip_fillers(self, norm: str) -> str:
        """The last variant: every filler taken off."""
        return collections.deque(self._variants(norm), maxlen=1).pop()

    @staticmethod
    def _cut_start(core: str, filler: str) -> str | None:
        if not core.startswith(filler) or len(core) == len(filler):
            return None
        after = core[len(filler)]
        if _is_word_char(filler[-1]) and _is_word_char(after):
            return None
        return core[len(filler):].strip(_SEPARATORS)

    @staticmethod
    def _cut_end(core: str, filler: str) -> str | None:
        if not core.endswith(filler) or len(core) == len(filler):
            return None
        before = core[-len(filler) - 1]
        if _is_word_char(filler[0]) and _is_word_char(before):
            return None
        return core[: -len(filler)].strip(_SEPARATORS)

    @staticmethod
    def _original_rest(text: str, rest: str) -> str:
        """The redirect's request as the user typed it (case kept) when it can be found, else normalised."""
        stripped = " ".join(text.split())
        index = stripped.casefold().rfind(rest)
        return stripped[index:index + len(rest)] if index >= 0 else rest
