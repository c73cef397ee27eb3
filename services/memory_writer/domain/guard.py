"""The poisoning guard: content that would steer an agent, or writes anomalous for their source.

Memory is read back into an agent's context, so text stored there acts like a prompt. The guard reads a
write the way a model would (folded: full-width and look-alike letters, invisible characters, letter-by-
letter spacing; `textfold`), finds independent features in each sentence (`_guard_lexicon`,
`_guard_markup`) and quarantines when they combine:

- decisive alone: chat special tokens and role/tool markup, a transcript of two speakers, active or hidden
  markup carrying instructions, a bidi override, text smuggled in tag characters, an unambiguous override of
  "your / previous / system instructions", a request for the agent's own prompt, a transfer of the
  conversation, memory or credentials to a URL or e-mail address;
- decisive together: a weaker override (someone's "previous rules") with a directive or a second feature; an
  identity given to "you" with constraints removed; a model addressed with an imperative; a memory command
  with a standing rule or an authority claim; a standing rule with "regardless" or aimed at the user; a
  header ("New task:"), a role line ("System:") or a mode switch ("developer mode") with a second feature.

A sentence addressed to a person ("From now on, you will receive invoices monthly"), someone else's
instructions ("the accountant said to ignore the previous rules"), acting ("kids pretend to be
astronauts") and label lines ("System: Windows 11") have at most one feature and pass. Writes anomalous for
their source: oversized model inferences, write bursts of one user, a model inference contradicting an L1
fact. No I/O here; `Signals` carries what the handler measured.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.memory_writer.domain import _guard_lexicon as lex
from services.memory_writer.domain._guard_markup import ROLE_LINE, ROLE_TAG, hidden_segments, markup_findings
from services.memory_writer.domain._guard_rules import decide, overrides
from services.memory_writer.domain._regex_literals import may_match
from services.memory_writer.domain.textfold import (
    close_spacing,
    fold_for_reading,
    fold_text,
    invisible,
    spaced_out,
    unleet,
)

__all__ = ["BURST_LIMIT", "Signals", "Verdict", "assess", "findings", "injected"]

BURST_LIMIT = 120  # default: writes of one user within a minute before the rest of the burst is held back
MAX_INFERENCE_CHARS = 4_000  # a model inference longer than this is not a fact, it is a payload

# Which reason each finding is reported under (the reasons are part of the API: quarantine_reasons).
_MARKUP_FINDINGS = frozenset({"chat_tokens", "role_markup", "transcript", "fake_turn", "active_content",
                              "data_image", "hidden_text", "bidi_override", "smuggled_text"})

# Sentence ends; after NFKC a Chinese "！？；" is ASCII, and ends a sentence when Chinese follows it.
_BOUNDARY = re.compile(r"[.!?;](?=\s)|[!?;](?=[^\x00-\x7f])|[。！？；\n]")
_WORDS = re.compile(r"[a-z]{2}|[\u3400-\u9fff]")
_SPACES = re.compile(r"[ \t]+")
_LINE_BREAKS = re.compile(r"\r\n|[\r\v\f\x1c-\x1e\x85\u2028\u2029]")  # each a line end, as a reader sees it
_MIXED_SCRIPT = re.compile(r"[A-Za-z][\u0370-\u03ff\u0400-\u04ff]|[\u0370-\u03ff\u0400-\u04ff][A-Za-z]")
_DISGUISED = re.compile(r"[\uff10-\uff19\uff21-\uff3a\uff41-\uff5a\U0001d400-\U0001d7ff]")  # full-width, math
_DAN = re.compile(r"(?<![A-Za-z])DAN(?![A-Za-z])")  # the jailbreak persona, upper case (Dan is a name)
_INSTRUCTIONAL = frozenset({"directive", "you_directive", "agent_addressed", "agent_directive",
                            "agent_mention_strong", "override_strong", "override_weak", "override_reported", "persona",
                            "roleplay", "unbound", "standing", "authority", "header", "header_ai", "prompt_leak",
                            "user_target", "memory_command", "role_line", "role_tag", "devmode", "obey"})
# Features that never decide, alone or with each other: only with one of the others (see _guard_rules).
_PARTNERS = ("directive", "you_directive", "user_target", "agent_mention", "agent_mention_strong", "unbound",
             "exfil_object", "external_destination", "own_data", "first_person_commit")
# Features too common to mark a short hidden comment ("<!-- end -->") as instructions on their own.
_GENERIC = frozenset({"directive", "user_target", "agent_mention_strong"})
# Full-width or mathematical letters are ordinary in some text (Chinese input methods): they count with a
# feature that reads as an instruction on its own. Letters hidden by zero-width characters, spelled out
# one by one, or mixing scripts inside a word count with any instruction-like feature.
_AFTER_DISGUISE = frozenset({"override_weak", "override_reported", "persona", "roleplay", "unbound",
                             "agent_addressed", "role_line", "role_tag", "header_ai", "authority", "prompt_leak",
                             "devmode", "obey"})


@dataclass(frozen=True)
class Signals:
    """What the handler measured around a write."""

    source: int = 0  # Source value
    recent_writes: int = 0  # writes of this user within the last minute, this one excluded
    contradicts_l1: bool = False  # a model inference of an entity key whose L1 value differs
    burst_limit: int = BURST_LIMIT  # the deployment's limit (settings: memory_burst_limit)


@dataclass(frozen=True)
class Verdict:
    reasons: tuple[str, ...]

    @property
    def quarantine(self) -> bool:
        return bool(self.reasons)


def _squeezed(text: str) -> str:
    return _SPACES.sub(" ", _LINE_BREAKS.sub("\n", text))


def _sentence_features(text: str, jailbreak_name: bool, every_feature: bool = True) -> list[set[str]]:
    """The features found in each sentence of `text` (reading form). Features that only ever complete another
    (a directive, a model mentioned, a destination...) are looked for only when one they complete is there,
    or when `every_feature` is asked for."""
    if not _WORDS.search(text):  # every feature needs a word of two letters or a Chinese character
        return []
    starts = [0] + [m.end() for m in _BOUNDARY.finditer(text)]
    sentences: list[set[str]] = [set() for _ in starts]

    def add(position: int, name: str) -> None:
        lo, hi = 0, len(starts)
        while hi - lo > 1:  # bisect: the sentence holding `position`
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if starts[mid] <= position else (lo, mid)
        sentences[lo].add(name)

    for name, pattern in lex.FEATURES.items():
        if name not in _PARTNERS and may_match(lex.GATES[name], text):
            for m in pattern.finditer(text):
                add(m.start(), name)
    for m in lex.CLAUSE_FEATURES.finditer(text):
        for name, value in m.groupdict().items():
            if value is not None:
                add(m.start(), name)
    for position, level in overrides(text):
        add(position, "override_" + level)
    for m in ROLE_LINE.finditer(text):
        add(m.start(), "role_line")
    for m in ROLE_TAG.finditer(text):
        add(m.start(), "role_tag")
    if jailbreak_name:
        for m in re.finditer(r"(?<![a-z])dan(?![a-z])", text):
            add(m.start(), "unbound")
    if every_feature or any(sentences):
        for name in _PARTNERS:
            if may_match(lex.GATES[name], text):
                for m in lex.FEATURES[name].finditer(text):
                    add(m.start(), name)
    return sentences


def _instructions(reading: str, disguise_partners: frozenset[str], jailbreak_name: bool) -> set[str]:
    return decide(_sentence_features(reading, jailbreak_name, bool(disguise_partners)), disguise_partners)


def findings(text: str) -> tuple[str, ...]:
    """What the guard found in `text`, by name (e.g. "override", "persona", "chat_tokens"); empty when benign."""
    shown = fold_text(text)
    raw = fold_for_reading(text)
    reading = _squeezed(raw)
    found = markup_findings(reading, shown)
    hidden = invisible(text)
    if hidden.bidi_override:
        found.add("bidi_override")
    if hidden.smuggled:
        found.add("smuggled_text")
    closed = _squeezed(close_spacing(raw))
    if hidden.zero_width_in_words or spaced_out(raw) or _MIXED_SCRIPT.search(text):
        disguise_partners = _INSTRUCTIONAL
    else:
        disguise_partners = _AFTER_DISGUISE if _DISGUISED.search(text) else frozenset()
    jailbreak_name = bool(_DAN.search(shown))
    for variant in dict.fromkeys((reading, closed, unleet(closed))):
        found |= _instructions(variant, disguise_partners, jailbreak_name)
    for segment in hidden_segments(shown) + ([hidden.smuggled] if hidden.smuggled else []):
        segment_reading = _squeezed(fold_for_reading(segment))
        sentences = _sentence_features(segment_reading, jailbreak_name)
        features = set().union(*sentences)
        if (features & _INSTRUCTIONAL - _GENERIC or decide(sentences, frozenset())
                or (features & _GENERIC and len(segment_reading.split()) >= 3)):
            found.add("hidden_text")
    return tuple(sorted(found))


def injected(text: str) -> list[str]:
    """The quarantine reasons `text` itself gives: injected_instructions, hidden_or_fake_markup."""
    found = set(findings(text))
    reasons = []
    if found - _MARKUP_FINDINGS:
        reasons.append("injected_instructions")
    if found & _MARKUP_FINDINGS:
        reasons.append("hidden_or_fake_markup")
    return reasons


def assess(content: str, signals: Signals = Signals()) -> Verdict:
    reasons = injected(content)
    if signals.source == 3 and len(content) > MAX_INFERENCE_CHARS:  # Source.MODEL_INFERENCE
        reasons.append("oversized_for_source")
    if signals.recent_writes >= signals.burst_limit:
        reasons.append("write_burst")
    if signals.contradicts_l1:
        reasons.append("inference_contradicts_l1")
    return Verdict(tuple(reasons))
