"""Markup that fakes a conversation or hides text from the person who reads it (no I/O).

Recognised by shape, not by lists of tokens: any `<|word|>` special token, turn markers, tags, brackets and
JSON `"role"` values naming a role or a tool, transcripts of two or more speakers; text made invisible by
style (font-size 0, opacity 0, display none, visibility hidden, white text, off-screen), by the `hidden`
attribute, in HTML or markdown comments; active content (scripts, frames, refresh redirects, event handlers
inside a tag, `javascript:` links) and images whose URL carries data. Every search is linear: comments are
found with `str.find`, each tag's attributes are bounded.
"""

from __future__ import annotations

import re

__all__ = ["ROLE_LINE", "ROLE_TAG", "hidden_segments", "markup_findings"]

_ROLES = ("system", "assistant", "user", "model", "tool", "function", "developer", "human", "ai", "bot",
          "系统", "助手", "助理", "用户", "人类", "机器人", "管理员", "admin", "administrator")
_ROLE = "(?:" + "|".join(_ROLES) + ")"
_CLASS = {"system": "s", "developer": "s", "admin": "s", "administrator": "s", "系统": "s", "管理员": "s",
          "instruction": "s", "assistant": "a", "ai": "a", "bot": "a", "model": "a", "gpt": "a", "chatgpt": "a",
          "response": "a", "助手": "a", "助理": "a", "机器人": "a", "agent": "a", "support": "a", "客服": "a",
          "user": "u", "human": "u", "用户": "u", "人类": "u", "input": "u", "customer": "u", "client": "u",
          "客户": "u", "顾客": "u", "tool": "t", "function": "t"}

_CHAT_TOKENS = re.compile(r"<\|[a-z_][a-z0-9_.\-]{0,30}\|>|<(?:start|end)_of_turn>|\[/?inst\]|<<\s?/?sys\s?>>")
_ROLE_JSON = re.compile(r"[\"'“”]role[\"'“”]\s?:\s?[\"'“”](?:system|assistant|user|tool|function|model|developer)"
                        r"[\"'“”]|[\"'“”](?:function_call|tool_calls?|tool_use|tool_result)[\"'“”]\s?:")
_TOOL_TAG = re.compile(r"<\s?/?\s?(?:tool_calls?|function_calls?|tool_use|tool_result|tool_response|tool_code|"
                       r"function_results?|invoke|antml:[a-z_]{1,20})\b")
_ROLE_OPEN = re.compile(r"<\s?(" + _ROLE + r"|instructions?|prompt|sys)(?:\s[^<>]{0,200})?>")
_ROLE_CLOSE = re.compile(r"</\s?(" + _ROLE + r"|instructions?|prompt|sys)\s?>")
_FAKE_ROLES = ("system", "assistant", "user", "model", "tool", "function", "developer", "human", "ai", "bot",
               "gpt", "chatgpt", "agent", "support", "customer", "client", "系统", "助手", "助理", "用户", "人类",
               "机器人", "客服", "客户", "顾客")
# A speaker label at a line's start ("User: …", "### Instruction:"), or after a sentence on the same line.
ROLE_LINE = re.compile(r"(?:^|(?<=\n)|(?<=[.!?。！？] ))[ \t]{0,8}(?:#{1,4} ?)?(" + "|".join(_FAKE_ROLES) +
                       r"|(?<=# )instruction|(?<=# )response|(?<=# )input)[ \t]{0,4}[:：]")
ROLE_TAG = re.compile(r"[\[【]\s?" + _ROLE + r"(?:\s?(?:message|prompt|note|instructions?|override|notice|update|command|"
                      r"alert|指令|消息|提示|通知|覆盖|命令|更新|设置|公告))?\s?[\]】]|<\s?" + _ROLE + r"\s?>")
_ACTIVE = re.compile(
    r"<\s?(?:script|iframe|object|embed|frameset|applet)\b|<\s?meta\b[^<>]{0,300}http-equiv\s?=\s?[\"']?refresh"
    r"|(?:href|src|action|formaction|xlink:href|data)\s?=\s?[\"']?\s?(?:javascript|vbscript|data:text/html)\s?:?"
    r"|\]\(\s?(?:javascript|vbscript):"
    r"|<[a-z][a-z0-9-]{0,20}\s[^<>]{0,500}?\bon[a-z]{3,20}\s?=\s?(?![\s{])")
_IMAGES = re.compile(r"!\[[^\]\n]{0,200}\]\(\s?([^)\s]{1,2000})|<img\b[^<>]{0,500}?\bsrc\s?=\s?[\"']?([^\"'\s>]{1,2000})",
                     re.IGNORECASE)
_PLACEHOLDER = re.compile(r"\{[^}]{0,60}\}|%7b|\$\{|\$[a-z_]{3,}|<[a-z_ ]{2,40}>|\[[a-z_ ]{3,40}\]|%s\b", re.IGNORECASE)
_CONSTANT = re.compile(r"\b[A-Z][A-Z0-9]{0,20}_[A-Z0-9_]{2,30}\b")  # USER_SECRET, CHAT_HISTORY
_TAG = re.compile(r"<([a-z][a-z0-9]{0,10})\b([^<>]{0,600})>", re.IGNORECASE)
_INVISIBLE_STYLE = re.compile(
    r"font-size\s?:\s?0(?:\.0+)?(?:px|pt|em|rem|%)?\s?(?:;|[\"']|$)|opacity\s?:\s?0(?:\.0+)?\s?(?:;|[\"']|$)"
    r"|display\s?:\s?none|visibility\s?:\s?hidden|(?<![-\w])color\s?:\s?(?:#fff(?:fff)?\b|white\b|rgba?\(\s?255\s?,"
    r"\s?255\s?,\s?255)|(?:max-)?(?:height|width)\s?:\s?0(?:px)?\s?(?:;|[\"']|$)"
    r"|(?:left|top|text-indent)\s?:\s?-\d{3,}|clip\s?:\s?rect\(\s?0", re.IGNORECASE)
_HIDDEN_ATTRIBUTE = re.compile(r"(?:^|\s)hidden(?:\s|=|$)", re.IGNORECASE)
_MARKDOWN_COMMENT = re.compile(r"(?:^|(?<=\n))[ \t]{0,3}\[[^\]\n]{0,40}\]:[ \t]{0,4}(?:#|<>)[ \t]{0,4}"
                               r"(?:\(([^\n]{0,2000})\)|\"([^\n]{0,2000})\")")
_INNER_TAGS = re.compile(r"<[^<>]{0,600}>")
_MAX_HIDDEN = 4_000  # characters of one hidden segment read for instructions
_MAX_HIDDEN_TOTAL = 20_000  # and of all of them (a write is at most 16,000 characters)
_MAX_SEGMENTS = 200


def markup_findings(reading: str, shown: str) -> set[str]:
    """Markup that decides alone: chat tokens, role/tool markup, transcripts, active content, data images."""
    found = set()
    if _CHAT_TOKENS.search(reading):
        found.add("chat_tokens")
    if _ROLE_JSON.search(reading) or _TOOL_TAG.search(reading) or _role_tag_pair(reading):
        found.add("role_markup")
    if len({_CLASS.get(m.group(1), "a") for m in ROLE_LINE.finditer(reading)}) >= 2:
        found.add("transcript")
    if _ACTIVE.search(reading):
        found.add("active_content")
    if any(_carries_data(m.group(1) or m.group(2)) for m in _IMAGES.finditer(shown)):
        found.add("data_image")
    return found


def _role_tag_pair(text: str) -> bool:
    """An opening role tag (<system>, <助手>) closed later by the same tag: a fake turn, not a placeholder."""
    first_open: dict[str, int] = {}
    for m in _ROLE_OPEN.finditer(text):
        first_open.setdefault(m.group(1), m.start())
    return any(first_open.get(m.group(1), len(text)) < m.start() for m in _ROLE_CLOSE.finditer(text))


def _carries_data(url: str) -> bool:
    """A URL with a template placeholder for the model to fill in ({chat}, [DATA], USER_SECRET, $x, %s).
    (Long hashes and query values are everyday CDN and badge URLs: not evidence on their own.)"""
    return bool(_PLACEHOLDER.search(url) or _CONSTANT.search(url))


def hidden_segments(shown: str) -> list[str]:
    """Text a person viewing the rendered markup would not see: comments, invisible elements."""
    segments = []
    start = shown.find("<!--")
    while start >= 0 and len(segments) < _MAX_SEGMENTS:
        end = shown.find("-->", start + 4)
        if end < 0:  # an unclosed comment hides the rest (and no later "-->" exists: stop looking)
            segments.append(shown[start + 4:start + 4 + _MAX_HIDDEN])
            break
        segments.append(shown[start + 4:min(end, start + 4 + _MAX_HIDDEN)])
        start = shown.find("<!--", end + 3)
    segments += [m.group(1) or m.group(2) for m in _MARKDOWN_COMMENT.finditer(shown)][:_MAX_SEGMENTS]
    read = sum(map(len, segments))
    for m in _TAG.finditer(shown):
        if read >= _MAX_HIDDEN_TOTAL:
            break
        attributes = m.group(2)
        if not (_INVISIBLE_STYLE.search(attributes) or _HIDDEN_ATTRIBUTE.search(attributes)):
            continue
        close = shown.find(f"</{m.group(1)}", m.end(), m.end() + _MAX_HIDDEN)
        inner = _INNER_TAGS.sub(" ", shown[m.end():close if close >= 0 else m.end() + _MAX_HIDDEN])
        segments.append(inner)
        read += len(inner)
    return [s for s in segments if s.strip()]
