"""Text folded for matching, and where each folded character came from (no I/O).

Both classifiers look at text the way a model reads it, not the way it was typed: full-width forms and
mathematical letters are folded (NFKC: "Ｉｇｎｏｒｅ" and "𝐈𝐠𝐧𝐨𝐫𝐞" are "Ignore", "１３８" is "138", "＠" is "@"),
invisible format characters (zero-width spaces and joiners, bidi controls, tag characters) are dropped.
The guard also folds Greek and Cyrillic letters that look Latin ("Іgnоrе" with Cyrillic і, о, е), drops
combining marks, and reads a copy with letter-by-letter spacing closed up ("I g n o r e", "忽 略 之 前").
A match in folded text is cut out of the original through `Folded.span`, so a redaction covers the whole
value even when invisible characters were typed inside it.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

__all__ = ["Folded", "Invisible", "close_spacing", "fold", "fold_for_reading", "fold_text", "invisible", "spaced_out", "unleet"]

# Greek and Cyrillic letters drawn like Latin ones (the common confusables; the full Unicode table is large
# and mostly maps symbols no attacker needs).
_LOOK_ALIKES = str.maketrans(
    "АВЕЅІЈКМНОРСТХУаеіјоросхуѕԁԛԝһӏ"
    "ΑΒΕΖΗΙΚΜΝΟΡΤΥΧαεικνορτυχɑɡıℓ",
    "ABESIJKMHOPCTXYaeijopocxysdqwhl"
    "ABEZHIKMNOPTYXaeikvoptuxagil")
# Invisible, yet not format characters: the combining grapheme joiner, Hangul fillers, Khmer and Mongolian
# invisible marks, the braille blank.
_BLANK_MARKS = "\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180f\u2800\u3164\uffa0"
_ZERO_WIDTH = frozenset("\u200b\u200c\u200d\u2060\ufeff\u180e" + _BLANK_MARKS)
_BIDI_OVERRIDES = frozenset("\u202d\u202e")  # left-to-right / right-to-left override: text shown reversed
_TAG_FIRST, _TAG_LAST = 0xE0000, 0xE007F  # invisible "tag" characters, each mirroring an ASCII one
_BLACK_FLAG = "\U0001f3f4"  # tag characters after it spell a regional flag (🏴 + "gbsct"): legitimate


@dataclass(frozen=True)
class Folded:
    """Folded text; `origin[i]` is the index in the original of folded character i (None: the same)."""

    text: str
    origin: tuple[int, ...] | None = None

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The original text's span behind folded `text[start:end]`."""
        if self.origin is None:
            return start, end
        first = self.origin[start]
        last = self.origin[end - 1] + 1 if end > start else first
        return first, last


# Format characters (Unicode category Cf, as of Unicode 15) and variation selectors: invisible, dropped.
_INVISIBLE = re.compile("[\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f"
                        "\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
                        "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001-\U000e007f"
                        "\ufe00-\ufe0f\U000e0100-\U000e01ef" + _BLANK_MARKS + "]")


def _dropped(ch: str) -> bool:
    return unicodedata.category(ch) == "Cf" or bool(_INVISIBLE.match(ch))


# A combining mark on an ASCII letter or digit: an accent no secret, key or number is written with.
_MARK_ON_ASCII = re.compile(r"[A-Za-z0-9][\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]")


def fold(text: str) -> Folded:
    """NFKC each character, drop format characters and combining marks on ASCII letters and digits; keep the way
    back to the original."""
    if text.isascii() or (unicodedata.is_normalized("NFKC", text) and not _INVISIBLE.search(text)
                          and not _MARK_ON_ASCII.search(text)):
        return Folded(text)  # nothing to fold (most Chinese text too)
    out: list[str] = []
    origin: list[int] = []
    for i, ch in enumerate(text):
        if ch.isascii():
            out.append(ch)
            origin.append(i)
            continue
        if _dropped(ch) or (out and out[-1].isascii() and out[-1].isalnum()
                            and unicodedata.category(ch) in ("Mn", "Me")):
            continue
        folded = unicodedata.normalize("NFKC", ch)
        out.append(folded)
        origin.extend([i] * len(folded))
    return Folded("".join(out), tuple(origin))


def fold_text(text: str) -> str:
    """`fold(text).text`, without the way back (faster: whole-string NFKC)."""
    if text.isascii():
        return text
    return unicodedata.normalize("NFKC", _INVISIBLE.sub("", text))


def fold_for_reading(text: str) -> str:
    """What the guard reads: `fold`, then combining marks (accents) dropped, look-alike letters made Latin, lower
    case."""
    if text.isascii():
        return text.lower()
    plain = unicodedata.normalize("NFKD", _INVISIBLE.sub("", text))  # compatibility forms, accents apart
    if any(unicodedata.combining(ch) for ch in plain):
        plain = "".join(ch for ch in plain if not unicodedata.combining(ch))
    plain = unicodedata.normalize("NFC", plain)
    return plain.translate(_LOOK_ALIKES).lower()


# A run of at least three single letters (or CJK characters) each followed by one spacer: "i g n o r e",
# "i.g.n.o.r.e", "忽 略 之 前". Each repetition consumes exactly two characters, so there is no backtracking.
_SPACED = re.compile(r"(?<![^\W_])[^\W_](?:[ ._*·\-][^\W_](?![^\W_])){2,}")


# Letters (not "0.6-0.8"), the same spacer throughout (not "a-z a-z").
_SPACED_WORD = re.compile(r"(?<![^\W_])[^\W\d_]([ ._*·\-])[^\W\d_](?![^\W_])(?:\1[^\W\d_](?![^\W_])){2,}")


def spaced_out(text: str) -> bool:
    """Whether `text` spells a word of four letters or more letter by letter ("i g n o r e")."""
    return bool(_SPACED_WORD.search(text))


def close_spacing(text: str) -> str:
    """`text` with letter-by-letter spacing closed up; word gaps (two spaces or more) stay one space."""
    return _SPACED.sub(lambda m: re.sub(r"[ ._*·\-]", "", m.group(0)), text)


_LEET = str.maketrans("0134579@$", "oieastgas")
_LEET_WORD = re.compile(r"(?<![a-z0-9@$])[a-z0-9@$]{4,40}(?![a-z0-9@$])")


def _unleet_word(match: re.Match[str]) -> str:
    word = match.group(0)
    letters = sum(ch.isalpha() for ch in word)
    if letters < 2 or letters == len(word):
        return word
    return word.translate(_LEET)


def unleet(text: str) -> str:
    """Digits used as letters inside lower-case words read as letters ("1gn0re" → "ignore")."""
    return _LEET_WORD.sub(_unleet_word, text)


@dataclass(frozen=True)
class Invisible:
    """What invisible characters did in a text."""

    smuggled: str  # text spelled in tag characters (invisible ASCII), outside flag emoji
    bidi_override: bool  # a left-to-right or right-to-left override (text displayed reversed)
    zero_width_in_words: bool  # zero-width characters splitting words, or runs of them


def invisible(text: str) -> Invisible:
    if text.isascii():
        return Invisible("", False, False)
    smuggled: list[str] = []
    bidi = in_words = False
    after_flag = False
    run = 0
    for i, ch in enumerate(text):
        code = ord(ch)
        if _TAG_FIRST <= code <= _TAG_LAST:
            if not after_flag and 0xE0020 <= code <= 0xE007E:
                smuggled.append(chr(code - _TAG_FIRST))
            continue
        after_flag = ch == _BLACK_FLAG
        if ch in _BIDI_OVERRIDES:
            bidi = True
        if ch in _ZERO_WIDTH:
            run += 1
            before = text[i - run] if i - run >= 0 else ""
            after = text[i + 1] if i + 1 < len(text) else ""
            if run >= 2 or (before.isalnum() and after.isalnum() and ch != "\u200d"):
                in_words = True
        else:
            run = 0
    return Invisible("".join(smuggled), bidi, in_words)
