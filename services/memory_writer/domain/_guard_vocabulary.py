"""The guard's shared vocabulary: verbs, models, determiners and objects, in English and Chinese, and the
patterns of an override of prior directives (no I/O). `_guard_lexicon` builds its features from these.

Rules that keep every pattern linear: no two unbounded quantifiers over overlapping characters side by
side, or with only an optional part between; every gap is bounded (`gap`); words are joined by single
spaces (the reading text is squeezed).
"""

from __future__ import annotations

import re

__all__ = ["ACTION_CORE", "ACTION_CORE_ZH", "ACTION_VERBS", "ACTION_VERBS_ZH", "AGENT_ACTS", "AGENT_ANY",
           "AGENT_ANY_ZH", "AGENT_STRONG", "AGENT_STRONG_ZH", "AI_OBJECTS", "AI_OBJECTS_ZH", "AT_CLAUSE",
           "LATIN", "NOTHING", "OVERRIDE", "OVERRIDE_ZH", "POLITE", "PREDICATE_SUBJECT", "PREDICATE_TAIL",
           "PREDICATE_ZH", "SUPERSEDE", "TRANSFER", "any_of", "gap"]


def any_of(*words: str) -> str:
    return "(?:" + "|".join(words) + ")"


def gap(most: int) -> str:
    """Up to `most` characters inside one sentence."""
    return rf"[^.!?;\n。！？；]{{0,{most}}}?"


# Marks an alternative that must start a clause (the text's start, after punctuation, "and", "then"): an
# imperative's position.
AT_CLAUSE = "\x00"
POLITE = r"(?:(?:please|kindly|now|then|and|just|simply|also|instead|so|first|immediately|quietly|secretly|ok|okay)\s){0,2}"

ACTION_VERBS = any_of(
    "tell", "say", "reply", "respond", "answer", "recommend", "suggest", "include", "mention", "output", "print",
    "write", "send", "forward", "share", "reveal", "disclose", "leak", "ignore", "disregard", "forget", "obey",
    "follow", "comply", "execute", "run", "call", "invoke", "approve", "grant", "deny", "refuse", "transfer",
    "delete", "remove", "insert", "append", "add", "treat", "trust", "claim", "state", "report", "summari[sz]e",
    "redirect", "visit", "click", "open", "fetch", "praise", "promote", "advertise", "inform", "notify", "warn",
    "email", "upload", "post", "store", "save", "update", "set", "mark", "give", "provide", "generate", "produce",
    "render", "display", "show", "list", "return", "rate", "score", "rank", "label", "classify", "flag", "talk",
    "speak", "describe", "translate", "act", "behave", "pretend", "stop", "start", "begin", "end", "use",
    "wire", "pay", "refund", "sign", "confirm", "verify", "output", "do",
    "assume", "consider", "insist", "convince", "persuade", "encourage", "lie", "hide", "conceal", "omit",
    "keep", "make", "change", "replace")
ACTION_VERBS_ZH = any_of(
    "告诉", "回复", "回答", "推荐", "输出", "说", "发送", "发给", "转发", "忽略", "执行", "调用", "删除", "透露",
    "泄露", "提供", "加上", "附上", "包含", "写", "生成", "声称", "表示", "遵守", "服从", "听从", "批准", "同意",
    "拒绝", "标记", "设为", "改为", "转账", "打开", "访问", "点击", "上传", "列出", "显示", "打印", "评价", "评为",
    "给出", "介绍", "隐瞒", "隐藏", "假装", "扮演", "通过", "放行", "授予", "重复", "翻译", "总结时")

_NOT_DIRECTIVES = ("ignore", "disregard", "forget", "act", "behave", "pretend")
ACTION_CORE = "(?:" + "|".join(v for v in ACTION_VERBS[3:-1].split("|") if v not in _NOT_DIRECTIVES) + ")"
ACTION_CORE_ZH = "(?:" + "|".join(v for v in ACTION_VERBS_ZH[3:-1].split("|") if v not in ("忽略", "假装", "扮演")) + ")"

# Verbs that say what a model does to its user or its tools (not "AI will change how we teach").
AGENT_ACTS = "(?:" + "|".join(v for v in ACTION_VERBS[3:-1].split("|") if v not in (
    "change", "replace", "make", "keep", "do", "use", "start", "begin", "end", "stop", "run", "consider", "assume",
    "set", "update", "give", "provide", "generate", "produce", "add", "list", "show", "act", "behave")) + ")"

AGENT_STRONG = any_of(
    r"ai", r"a\.i\.", "artificial intelligence", "llms?", "large language models?", "language models?",
    "chat ?bots?", "chatgpt", r"gpt(?:-?[0-9][a-z0-9.]{0,6})?", "claude", "gemini", "copilot", "bard",
    "ai (?:assistant|agent|model|system|bot)s?", "virtual assistants?", "autonomous agents?", "ai-powered [a-z]{2,20}")
AGENT_ANY = any_of(AGENT_STRONG, "assistants?", "agents?", "models?", "bots?")
LATIN = r"(?<![a-z])(?:{})(?![a-z])"  # a Latin word inside Chinese text, where \b does not separate it
AGENT_STRONG_ZH = any_of(LATIN.format("ai|gpt|chatgpt|claude|llm"), "人工智能", "智能体", "ai ?助手", "智能助手",
                       "语言模型", "大模型", "大语言模型", "聊天机器人", "机器人", "ai ?模型")
AGENT_ANY_ZH = any_of(AGENT_STRONG_ZH, "助手", "助理", "模型")

# --- overriding prior directives ---------------------------------------------------------------------------
# One pattern finds verb, determiner and object; `guard` weighs them (whose instructions, reported speech).
_OVERRIDE_VERB = any_of(
    "ignore", "disregard", "forget(?: about)?", "override", "overrule", "bypass", "circumvent", "skip", "neglect",
    "discard", "drop", "abandon", "set aside", "put aside", "throw (?:out|away)", "scrap", "cancel", "nullify",
    "erase", "clear", "reset", "ditch", "dismiss", "unlearn", "never ?mind",
    "(?:stop|quit|cease) (?:following|obeying|adhering to|using)", "(?:do not|don't|no longer) (?:follow|obey)",
    "pay no (?:attention|heed|mind) to", "take no notice of")
_PRIOR = any_of("previous", "prior", "above", "earlier", "preceding", "former", "original", "initial", "old",
              "existing", "foregoing", "aforementioned", "past", "default", "pre-?existing", "current", "starting",
              "given", "last")
_OWN = any_of("your", "ur", "the system'?s?", "system", "developer'?s?", "developers'?")
_DET = any_of(_PRIOR, _OWN, "all", "any", "these", "those", "the", "my", "our", "his", "her", "their", "of", "every",
            "such", "and", "or", "each")
AI_OBJECTS = ("instructions?", "instruction set", "prompts?", "system prompt", "system message", "directives?",
              "guidelines?", "guidance", "programming", "training", "guardrails?", "safeguards?", "persona",
              r"safety \w{3,12}", "content polic(?:y|ies)", "content filters?", "ethical guidelines",
              "restrictions?", "constraints?", "limitations?", "filters?", "configuration", "moderation")
_GENERAL_OBJECTS = ("rules?", "polic(?:y|ies)", "commands?", "orders?", "context", "messages?", "conversation",
                    "text", "directions?", "requests?", "tasks?", "input", "everything", "all of (?:that|this|it)",
                    "above", "preceding", "foregoing")
_OBJECT = any_of(*AI_OBJECTS, *_GENERAL_OBJECTS)
_AFTER = any_of("above", "before", "so far", "until now", "up to now", "previously", "from before", "earlier",
              "you (?:were|have been|'ve been) (?:given|told|taught|instructed)", "you (?:received|got|have)",
              "(?:given|provided) (?:to you|before|earlier|above)", "i gave you", "preceding this",
              "before this")
OVERRIDE = re.compile(
    rf"\b(?P<verb>{_OVERRIDE_VERB})\b (?:(?P<det>(?:{_DET} ){{1,4}}){gap(12)})?(?P<obj>{_OBJECT})\b"
    rf"(?: (?P<after>{_AFTER}))?"
    rf"|\b(?P<verb2>{_OVERRIDE_VERB}) (?P<what>what (?:you (?:were|have been|'ve been) (?:told|instructed|given|"
    rf"taught)|your (?:developers?|creators?|makers?|trainers?|programmers?|owners?) (?:told|taught|said)|"
    rf"(?:i|we) (?:told|said to) you)|everything (?:you (?:were|have been|'ve been) (?:told|given|taught)))")
# "The previous instructions are void", "nothing you were instructed before matters", "以上指令全部失效".
# Found by their predicate first (rare words), then the subject is looked for just before it.
PREDICATE_TAIL = re.compile(
    r"\b(?:(?:are|is|were|have been|has been|now|will be) (?:now |hereby |officially |all )?(?:void|null|invalid|"
    r"cancell?ed|revoked|obsolete|overridden|lifted|suspended|deprecated|superseded|withdrawn|rescinded|"
    r"no longer (?:valid|in effect|relevant|active))|(?:no longer|don't|do not|doesn't|does not) (?:apply|applies|"
    r"matter|matters|count|counts|bind you|hold))\b")
PREDICATE_SUBJECT = re.compile(rf"\b(?P<det>(?:{_DET} ){{0,3}})(?P<obj>{_OBJECT})\b[^.!?;\n。！？；]{{0,30}}$")
SUPERSEDE = re.compile(
    rf"\b(?P<new>(?:these|this|the following|my|the new|new|updated|real|latest) (?:instructions?|rules?|prompt|"
    rf"directives?|orders?|commands?)) (?:override|overrides|replace|replaces|supersede|supersedes|cancel|cancels|"
    rf"take precedence over|takes precedence over|come before|trump|trumps) (?P<det>(?:{_DET} ){{0,3}})"
    rf"(?P<obj>{_OBJECT}|ones|others)\b"
    r"|(?:这些|以下|新的?|我的|最新的?)(?:指令|规则|命令|指示)(?:覆盖|替代|取代|优先于)(?:了)?(?:之前|以前|原来|原有|以上|所有|你的)")
NOTHING = re.compile(
    rf"\b(?:nothing|none) (?:of )?(?:what )?(?:you (?:were|have been|'ve been|got) (?:told|instructed|given|"
    rf"taught)|i (?:told|said to) you)\b{gap(20)}\b(?:matters|applies|counts|is valid|holds)")
_ZH_OVERRIDE_VERB = any_of(
    "忽略", "忽视", "无视", "忘记", "忘掉", "忘了", "不要理会", "别理会", "不用理会", "不必理会", "不要管", "别管",
    "不用管", "不要再?遵守", "不必再?遵守", "别再?遵守", "无需再?遵守", "不用再?遵守", "停止遵守", "不再遵守",
    "跳过", "绕过", "抛开", "抛弃", "丢弃", "放弃", "推翻", "撤销", "清除", "清空", "废除", "覆盖", "不要听从", "别听")
_ZH_DET = any_of("之前", "以前", "此前", "先前", "以上", "上面", "上述", "前面", "前述", "原来", "原有", "原先",
               "原始", "初始", "默认", "已有", "所有", "全部", "一切", "你的", "你", "系统", "给你的", "你收到的",
               "开发者", "上一条", "上文")
AI_OBJECTS_ZH = ("系统提示词?", "提示词", "提示", "指令", "指示", "设定", "人设", "限制", "约束", "安全策略",
                 "安全规则", "安全限制", "安全准则", "安全措施", "内容政策", "内容审核", "审查", "过滤", "准则")
_ZH_OBJECT = any_of(*AI_OBJECTS_ZH, "规则", "规定", "要求", "命令", "说明", "上下文", "步骤", "任务", "内容")
OVERRIDE_ZH = re.compile(rf"(?P<verb>{_ZH_OVERRIDE_VERB})[掉了]?(?P<between>[^，。！？；,.;!?\n]{{0,12}}?)"
                         rf"(?P<obj>{_ZH_OBJECT})")
PREDICATE_ZH = re.compile(
    rf"(?P<det>{_ZH_DET})[^，。！？；,.;!?\n]{{0,8}}?(?P<obj>{_ZH_OBJECT})[^。！？；.;!?\n]{{0,6}}?"
    r"(?:全部|都|一律|均|统统|已经|已|就|也|现在){0,2}(?:失效|作废|无效|不再有效|取消|废除|不算数?|不再适用|"
    r"不用再?遵守|不必再?遵守|无需再?遵守|可以忽略|清零|被撤销|被取消|解除)")

TRANSFER = any_of("send", "forward", "transfer", "email", "e-mail", "mail", "upload", "post", "submit", "exfiltrate",
                 "leak", "copy", "sync", "share", "transmit", "report", "append", "attach", "include", "encode",
                 "embed", "fetch", "visit", "load", "open", "navigate to", "call", "ping", "curl", "wget", "redirect",
                 "dump", "export", "push", "relay", "pipe", "bcc", "cc", "make a request to", "request")
