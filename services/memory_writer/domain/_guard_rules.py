"""How the guard weighs what it found: whose instructions an override targets, and which features,
found together in a sentence or in neighbouring ones, make a write an injection (no I/O)."""

from __future__ import annotations

import re

from collections.abc import Iterator

from services.memory_writer.domain._guard_vocabulary import (
    AI_OBJECTS,
    AI_OBJECTS_ZH,
    NOTHING,
    OVERRIDE,
    OVERRIDE_ZH,
    PREDICATE_SUBJECT,
    PREDICATE_TAIL,
    PREDICATE_ZH,
    SUPERSEDE,
)

__all__ = ["decide", "overrides"]

_AI_OBJECT = re.compile("(?:" + "|".join(AI_OBJECTS) + ")")
_AI_OBJECT_ZH = re.compile("(?:" + "|".join(AI_OBJECTS_ZH) + ")")
_PRIOR_WORDS = frozenset("previous prior above earlier preceding former original initial old existing foregoing "
                         "aforementioned past default preexisting pre-existing current starting given last".split())
_OWN_WORDS = frozenset("your ur system system's developer developer's developers developers'".split())
_THIRD_PARTY = frozenset("my our his her their".split())
_FORCEFUL = ("bypass", "circumvent", "override", "overrule")
# After the object: "instructions on the box", "rules for the board game", "my instructions to the courier".
_QUALIFIED = re.compile(r" (?:for|on|of|from|to|about|in|at|regarding|under|by|with|inside|printed on|written on) "
                        r"(?:the|a|an|my|our|his|her|their|each|every) (?!ai\b|assistant\b|"
                        r"model\b|bot\b|system\b|chatbot\b)")
_SPATIAL_ABOVE = re.compile(r" (?:the|a|an|my|our|his|her|their|each|every|[a-z]+'s|monday|tuesday|wednesday|"
                            r"thursday|friday|saturday|sunday|\d)")
# The words that may stand before an imperative addressed to the agent in its own clause.
_ADDRESSING = frozenset("please kindly now just simply and then so also you can could must should will shall need "
                        "to have first immediately hey ok okay hi hello from on here instead completely entirely "
                        "totally dear note attention important urgent all right well oh but actually yes no ai "
                        "assistant model bot chatbot llm agent gpt chatgpt going forward henceforth remember".split())
_ASKING_YOU = re.compile(r"(?:i (?:want|need|would like|'d like) you to|you (?:must|should|need to|have to|are to|"
                         r"can|will|shall|may)) ?$")
_CLAUSE_EN = re.compile(r"[^,;:\n.!?]{0,80}$")
_ZH_ADDRESSING = re.compile(r"请|你|现在|立即|立刻|马上|直接|可以|必须|要|先|都|全部|就|也|再|从现在起|从现在开始|接下来|然后|并且?|"
                            r"记住|注意|ai|助手|模型|[ ，,:：]")
_ZH_BETWEEN = re.compile(r"你|的|之前|以前|此前|先前|以上|上面|上述|前面|前述|原来|原有|原先|原始|初始|默认|已有|所有|全部|一切|"
                         r"系统|给你|收到|开发者|上一条|上文|这些|那些|这条|那条|掉|了|再|都|任何|中|里|设置|过|曾经|被| ")


def _cjk(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


def _clause_before(text: str, start: int) -> str:
    """The words of the same clause before `start`."""
    window = text[max(0, start - 80):start]
    m = _CLAUSE_EN.search(window)
    return m.group(0) if m else ""


def _someone_else(text: str, start: int) -> bool:
    """Whether the clause before `start` has a subject or a speaker other than the agent ("the accountant said
    to", "we can", "他让我"): then the override is reported, or aimed at someone else."""
    before = _clause_before(text, start)
    if _cjk(before[-12:]):
        clause = re.split(r"[，。！？；,;:：\n]", before)[-1]
        return bool(_ZH_ADDRESSING.sub("", clause).strip())
    if _ASKING_YOU.search(before):
        return False
    words = re.findall(r"[a-z'’]+", before.lower())
    return any(w not in _ADDRESSING for w in words)


def _level(strong: bool, text: str, start: int) -> str:
    """'reported' when someone else's voice carries the override, else 'strong' or 'weak'."""
    if _someone_else(text, start):
        return "reported"
    return "strong" if strong else "weak"


def override_strength(text: str, m: re.Match[str]) -> str:
    """'strong' when the override is aimed at the agent's own or prior instructions, in an imperative
    addressed to it; 'weak' (needing a second feature) for other objects, 'reported' when it is someone
    else's (it needs a feature that addresses the agent)."""
    if "between" in m.re.groupindex:  # Chinese: 忽略(之前的所有)指令
        between, obj = m.group("between"), m.group("obj")
        third = bool(_ZH_BETWEEN.sub("", between).strip())
        own = "你" in between or "系统" in between
        prior = between != "" and not third
        forceful = m.group("verb") in ("绕过", "推翻", "废除")
        everything = any(w in between for w in ("所有", "全部", "一切"))
        strong = not third and ((bool(_AI_OBJECT_ZH.fullmatch(obj)) and (prior or forceful)) or own
                                or (prior and everything))
        return _level(strong, text, m.start())
    if m.group("what"):
        return _level(True, text, m.start())
    det = (m.group("det") or "").split()
    obj, after = m.group("obj"), m.group("after") or ""
    if after in ("above", "before", "earlier") and _SPATIAL_ABOVE.match(text, m.end()):
        after = ""  # "the instructions above the sink", "everything before the meeting"
    ai_object = bool(_AI_OBJECT.fullmatch(obj))
    prior = any(w in _PRIOR_WORDS for w in det) or bool(after)
    own = any(w in _OWN_WORDS for w in det) or "you" in after
    third = any(w in _THIRD_PARTY for w in det) or bool(_QUALIFIED.match(text, m.end()))
    forceful = m.group("verb").startswith(_FORCEFUL)
    everything = "all" in det or "every" in det or obj.startswith(("everything", "all of"))
    strong = not third and ((ai_object and (prior or own or everything or forceful)) or own or (prior and everything))
    return _level(strong, text, m.start())


def predicate_strength(text: str, m: re.Match[str]) -> str:
    """'strong' for "the previous instructions are void" / "以上指令全部失效"; `m`: the subject's match."""
    det, obj = (m.group("det") or "").split(), m.group("obj")
    if _cjk(obj):
        everything = any(w in m.group(0)[:m.end("obj") - m.start()] for w in ("所有", "全部", "一切"))
        strong = bool(_AI_OBJECT_ZH.fullmatch(obj)) or everything or "你" in m.group("det") or "系统" in m.group("det")
    else:
        prior = any(w in _PRIOR_WORDS for w in det) or "all" in det
        own = any(w in _OWN_WORDS for w in det)
        strong = not any(w in _THIRD_PARTY for w in det) and ((bool(_AI_OBJECT.fullmatch(obj)) and prior) or own)
    return _level(strong, text, m.start())


def overrides(text: str) -> Iterator[tuple[int, str]]:
    """Where `text` overrides prior directives, and how strongly: 'strong', 'weak' or 'reported'."""
    for pattern in (OVERRIDE, OVERRIDE_ZH):
        for m in pattern.finditer(text):
            yield m.start(), override_strength(text, m)
    for m in PREDICATE_TAIL.finditer(text):
        subject = PREDICATE_SUBJECT.search(text, max(0, m.start() - 100), m.start())
        if subject:
            yield subject.start(), predicate_strength(text, subject)
    for m in PREDICATE_ZH.finditer(text):
        yield m.start(), predicate_strength(text, m)
    for m in SUPERSEDE.finditer(text):
        own = m.group("det") and any(w in _OWN_WORDS for w in m.group("det").split())
        yield m.start(), _level(bool(own) or "你的" in m.group(0), text, m.start())
    for m in NOTHING.finditer(text):
        yield m.start(), _level(True, text, m.start())


# --- combinations ------------------------------------------------------------------------------------------

_WEAK_OVERRIDE_PARTNERS = frozenset({"directive", "you_directive", "agent_addressed", "agent_directive", "persona",
                                     "roleplay", "unbound", "authority", "header", "header_ai", "role_line",
                                     "role_tag", "devmode", "prompt_leak", "standing", "obey", "new_task"})
_REPORTED_OVERRIDE_PARTNERS = frozenset({"agent_addressed", "agent_directive", "persona", "roleplay", "unbound",
                                         "authority", "role_line", "role_tag", "devmode", "prompt_leak", "header_ai",
                                         "obey"})
_ADDRESSED_PARTNERS = frozenset({"directive", "you_directive", "standing", "prompt_leak", "override_weak",
                                 "regardless", "persona", "roleplay", "unbound"})
_HEADER_PARTNERS = frozenset({"new_task", "override_weak", "persona", "roleplay", "unbound", "agent_addressed", "agent_directive",
                              "authority", "prompt_leak", "devmode", "header_ai", "standing"})
_ROLE_PARTNERS = frozenset({"you_directive", "authority", "override_weak", "override_reported", "unbound",
                            "agent_directive", "persona", "persona_generic", "roleplay", "devmode", "header_ai",
                            "prompt_leak", "standing", "first_person_commit", "obey"})
_AUTHORITY_PARTNERS = frozenset({"override_weak", "you_directive", "memory_command", "role_line", "role_tag",
                                 "header", "header_ai", "agent_addressed"})
_IDENTITY = frozenset({"persona", "persona_generic", "roleplay"})


def _combine(same: set[str], pair: set[str], window: set[str]) -> set[str]:
    """Findings from the features of one sentence (`same`), it and the next (`pair`), and the next two."""
    found = set()
    if "override_strong" in same or ("override_weak" in same and window & _WEAK_OVERRIDE_PARTNERS) or (
            "override_reported" in same and window & _REPORTED_OVERRIDE_PARTNERS):
        found.add("override")
    if (same & _IDENTITY and "unbound" in window) or (same & {"persona", "roleplay"} and "agent_mention" in same) or (
            "roleplay" in same and pair & {"directive", "you_directive", "user_target", "authority", "obey"}):
        found.add("persona")
    if "obey" in same and pair & {"standing", "you_directive", "persona", "persona_generic", "override_weak",
                                  "override_reported", "role_line", "role_tag", "header", "header_ai"}:
        found.add("obedience")
    if "agent_directive" in same or ("agent_addressed" in same and pair & _ADDRESSED_PARTNERS):
        found.add("indirect")
    if {"transfer", "external_destination", "exfil_object"} <= same and (
            "own_data" not in same or "agent_addressed" in pair):
        found.add("exfiltration")
    if "prompt_leak" in same:
        found.add("prompt_leak")
    if "memory_command" in same and (window & {"standing", "authority"} or (
            "regardless" in window and window & {"user_target", "directive"})):
        found.add("planting")
    if ("standing" in pair and "regardless" in pair) or (
            pair & {"standing", "regardless"} and "directive" in pair and pair & {"user_target", "agent_mention_strong"}):
        found.add("standing_rule")
    if "header" in same and window & _HEADER_PARTNERS:
        found.add("directive_header")
    if "header_ai" in same and pair & {"directive", "you_directive", "authority", "unbound", "override_weak", "persona",
                                       "persona_generic", "obey"}:
        found.add("system_override")
    if same & {"role_line", "role_tag"} and pair & _ROLE_PARTNERS:
        found.add("fake_turn")
    if "devmode" in same and window & {"unbound", "override_weak", "override_strong", "agent_mention_strong",
                                       "persona", "roleplay"}:
        found.add("devmode")
    if "authority" in same and pair & _AUTHORITY_PARTNERS:
        found.add("authority")
    return found


def decide(sentences: list[set[str]], disguise_partners: frozenset[str]) -> set[str]:
    """Findings of a text from its sentences' features; `disguise_partners`: the features that make a disguised
    text (zero-width characters, spaced-out or look-alike letters) an injection."""
    found: set[str] = set()
    count = len(sentences)
    for i, same in enumerate(sentences):
        if not same:
            continue
        pair = same | (sentences[i + 1] if i + 1 < count else set())
        window = pair | (sentences[i + 2] if i + 2 < count else set())
        found |= _combine(same, pair, window)
    if disguise_partners and any(s & disguise_partners for s in sentences):
        found.add("disguised_instructions")
    return found
