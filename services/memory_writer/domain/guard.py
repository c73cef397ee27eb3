"""The poisoning guard: content that would steer an agent, or writes anomalous for their source.

Memory is read back into an agent's context, so text stored there acts like a prompt. The guard
quarantines (stores apart, never serves) content that carries:

- injected instructions, English and Chinese: "ignore previous instructions", "you are now…",
  "你现在是…", "忽略之前的指令", role-play set-ups, "reveal your system prompt";
- fake conversation or tool markup: chat-template tokens (<|im_start|>, [INST], <<SYS>>), role
  lines ("System:", "Assistant:"), tool-call JSON or tags;
- hidden markup: HTML comments, scripts, event handlers, zero-width runs, markdown images that
  would send data to a URL;

and writes anomalous for their source: oversized model inferences, write bursts of one user,
a model inference contradicting an L1 fact. Benign look-alikes ("ignore the previous email",
"我现在是学生", "she said to act as a mentor") are not caught: patterns require the imperative
addressed to the agent. No I/O here; `Signals` carries what the handler measured.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["BURST_LIMIT", "Signals", "Verdict", "assess"]

BURST_LIMIT = 120  # default: writes of one user within a minute before the rest of the burst is held back
MAX_INFERENCE_CHARS = 4_000  # a model inference longer than this is not a fact, it is a payload

_I = re.IGNORECASE
_INSTRUCTIONS = [
    re.compile(r"\b(ignore|disregard|forget|override|bypass|skip)\b[^.\n]{0,30}\b(all\s+)?(the\s+)?(previous|prior|"
               r"above|earlier|preceding|former|your|system|original)\s+(instructions?|prompts?|rules?|directions?|"
               r"guidelines?|context)", _I),
    re.compile(r"\byou\s+(are|will\s+be|shall\s+be)\s+now\b|\bfrom\s+now\s+on,?\s+you\s+(are|will|must|should|shall)"
               r"\b|\byou\s+are\s+no\s+longer\b", _I),
    re.compile(r"\b(now\s+)?(act|behave|respond)\s+as\s+(if\s+you\s+were\s+)?(an?\s+)?(unrestricted|unfiltered|"
               r"jailbroken|evil|different|new)\b|\bpretend\s+(that\s+)?(you\s+are|to\s+be)\b|\broleplay\s+as\b|"
               r"\b(enter|enable|activate)\s+(developer|god|dan|jailbreak)\s+mode\b|\bdo\s+anything\s+now\b", _I),
    re.compile(r"\b(reveal|print|show|repeat|output|leak)\s+(me\s+)?(your|the)\s+(system\s+prompt|hidden\s+"
               r"instructions|initial\s+instructions|instructions\s+above)\b", _I),
    re.compile(r"\bnew\s+(system\s+)?(instructions?|task)\s*[:：]|\bsystem\s+(override|prompt)\s*[:：]|"
               r"\bimportant\s*[:：]\s*(the\s+)?(assistant|ai|model)\s+(must|should|will)\b", _I),
    re.compile(r"\b(always|never)\s+(recommend|tell|say|answer|reply|respond|mention)\b[^.\n]{0,60}\b(regardless|"
               r"no\s+matter|whatever)\b", _I),
    re.compile(r"\b(send|forward|transfer|email|upload|exfiltrate)\b[^.\n]{0,40}\b(all|every|the\s+user'?s?)\s+("
               r"conversation|chat\s+history|memor(y|ies)|passwords?|credentials|api\s+keys?|data)\b[^.\n]{0,40}\bto\b",
               _I),
    re.compile(r"(忽略|无视|忘记|忘掉|不要理会|不要遵守|跳过|绕过)(掉)?(你)?(之前|以上|上面|前面|先前|原来|原有|所有|系统)?的?"
               r"(所有|全部|一切)?的?(指令|指示|提示|提示词|规则|设定|要求|命令|说明|限制)"),
    re.compile(r"(你现在是|你现在扮演|从现在起你|从现在开始你|现在开始你是|你不再是|你的新身份是|你将扮演)"),
    re.compile(r"(扮演|假装你是|假装自己是|角色扮演)(一个|一名|一位)?[^，。,.\n]{0,12}(不受限制|没有限制|无限制|邪恶|黑客|DAN)|"
               r"(进入|开启|启用)(开发者|上帝|越狱)模式"),
    re.compile(r"(输出|告诉我|显示|泄露|重复)(你的)?(系统提示|系统提示词|隐藏指令|初始指令)"),
    re.compile(r"(新的?指令|系统指令|最高指令)\s*[:：]"),
    re.compile(r"(把|将)(用户的?)?(所有|全部)?(对话|聊天记录|记忆|密码|凭证|数据)[^，。\n]{0,10}(发送|转发|上传)(到|给)"),
    re.compile(r"(无论|不管)(用户)?(问|说)什么[^，。\n]{0,6}(都|一律)(回答|推荐|说|回复)"),
]
_MARKUP = [
    re.compile(r"<\|(im_start|im_end|system|user|assistant|endoftext)\|>|\[/?INST\]|<<\s*/?SYS\s*>>|</?s>\s*\[INST",
               _I),
    re.compile(r"(^|\n)\s*(system|assistant|###\s*(system|instruction)|系统|助手)\s*[:：]\s*\S", _I),
    re.compile(r"<\s*/?\s*(tool_call|function_call|tool_use|tool_result|invoke)\b|\"(function_call|tool_calls)\"\s*:",
               _I),
    re.compile(r"<!--[\s\S]*?-->|<\s*script\b|\bon(error|load|click)\s*=|javascript\s*:|<\s*iframe\b|"
               r"style\s*=\s*[\"'][^\"']*display\s*:\s*none", _I),
    re.compile(r"!\[[^\]]*\]\(\s*https?://[^)\s]*\?[^)\s]*=", _I),
    re.compile(r"[\u200b\u200c\u200d\u2060\ufeff\u202e\u2066-\u2069]{2,}|[\U000e0000-\U000e007f]"),
]


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


def injected(text: str) -> list[str]:
    reasons = []
    if any(p.search(text) for p in _INSTRUCTIONS):
        reasons.append("injected_instructions")
    if any(p.search(text) for p in _MARKUP):
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
