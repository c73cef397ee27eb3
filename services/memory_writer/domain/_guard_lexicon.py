"""The guard's features: one pattern per feature of a text, in English and Chinese (no I/O).

Each pattern finds one independent feature (an override of prior directives, an identity given to "you",
constraints removed, a model addressed, a standing rule, an authority claim...); `guard` decides from their
combination. Patterns read lower-case, folded text (`textfold.fold_for_reading`) with spacing squeezed to
single spaces.

Every pattern stays linear in the text's length (the rules are in `_guard_vocabulary`).
"""

from __future__ import annotations

import re

from services.memory_writer.domain._guard_vocabulary import (
    ACTION_CORE,
    ACTION_CORE_ZH,
    ACTION_VERBS,
    ACTION_VERBS_ZH,
    AGENT_ACTS,
    AGENT_ANY,
    AGENT_ANY_ZH,
    AGENT_STRONG,
    AGENT_STRONG_ZH,
    AT_CLAUSE,
    LATIN,
    POLITE,
    TRANSFER,
    any_of,
    gap,
)
from services.memory_writer.domain._regex_literals import gate_of

__all__ = ["CLAUSE_FEATURES", "FEATURES", "GATES"]


_WHOM = r"(?:the |any |all |every |each |an? )?"
_READERS = ("reading", "reads", "processing", "processes", "summari[sz]ing", "summari[sz]es", "parsing",
            "reviewing", "reviews", "analy[sz]ing", "seeing", "sees", "handling", "indexing", "crawling",
            "scraping", "ingesting", "evaluating", "screening")
_ZH_READERS = any_of("阅读", "处理", "总结", "分析", "读取", "浏览", "审阅", "审核", "筛选", "看到")
_FEATURES: dict[str, str | tuple[str, ...]] = {
    # an identity given to "you"
    "persona": (
        r"\byou(?:'re| are| will be|'ll be| shall be) (?:now|no longer|henceforth|from now on|going to be)\b",
        AT_CLAUSE + r"(?:and )?now,? you(?:'re| are) (?![a-z]+ing\b)",
        r"\b(?:from now on|henceforth|starting now|going forward|from this (?:moment|point)(?: on)?|as of now|"
        r"starting today|beginning now),? you(?:'re| are| will be|'ll be)\b",
        r"\byour (?:new )?(?:name|identity|role|persona|character|personality) (?:is|will be|is now)\b",
        r"\bi (?:want|need|would like) you to (?:act|behave|pretend|play|roleplay|role-play|be|become|simulate)\b",
        r"你(?:现在|从现在起|从现在开始|从今以后|今后|以后)(?:就)?(?:是|成为|变成)(?:一个|一名|一位|个)(?![^，。？?,]{0,20}[吗？?])",
        r"你(?:现在|从现在起|从现在开始|从今以后|今后)(?:就)?是(?!不是)(?![^，。？?,]{0,20}[吗？?])",
        r"(?:从现在起|从现在开始|现在开始|从今以后)[，,]?你(?:就)?是",
        r"\b(?:stop|quit) being (?:an? |the |my )?(?:helpful |polite |safe )?(?:ai|assistant|chatbot|language model|"
        r"model|bot)\b|\byou(?:'re| are) (?:no longer|not) (?:an? |the )?(?:ai|assistant|chatbot|language model)\b",
        r"别(?:再)?当(?:一个)?(?:ai|助手|机器人|模型)|你不是(?:一个)?(?:ai|助手|机器人|模型)",
        r"你(?:现在|目前|从现在起)?的?(?:新的?)?(?:身份|名字|角色|人设)(?:现在)?(?:是|为|改为|变成)", r"你不再是"),
    "persona_generic": (r"\byou(?:'re| are) (?:an?|the) ", r"\byou(?:'re| are) [a-z][a-z0-9_-]{1,20}, (?:an?|the) ",
                            r"你(?:就)?是(?:一个|一名|一位|个)(?![^，。？?,]{0,20}[吗？?])"),
    "agent_mention": (rf"\b{AGENT_ANY}\b", AGENT_ANY_ZH),
    "agent_mention_strong": (rf"\b{AGENT_STRONG}\b", AGENT_STRONG_ZH),
    # role-play commanded (an imperative, or "you will act as"), not someone else acting
    "roleplay": (
        AT_CLAUSE + POLITE + r"(?:act|behave|respond|reply|answer|speak|talk|write|function|operate) (?:as|like)\b",
        AT_CLAUSE + POLITE + r"(?:pretend|imagine) (?:that )?(?:you(?:'re| are| were| have| had| can| could| don't|"
        r" do not| no longer)|to be)\b",
        AT_CLAUSE + POLITE + r"(?:roleplay|role-play|role play|impersonate|simulate|emulate|become|embody|"
        r"play the (?:role|part) of|take on the (?:role|persona) of|assume the (?:role|persona|identity) of)\b",
        r"\byou (?:will|shall|must|are to|should|are going to) (?:now )?(?:act|behave|pretend|respond|answer) "
        r"(?:as|like|to be)\b|\byou (?:will|shall|must|are to|should|are going to) (?:now )?(?:roleplay|role-play|"
        r"play the (?:role|part) of|simulate|impersonate|emulate|become)\b",
        r"(?:^|[，。！？；：:\s]|请|现在|你(?:现在|将|要|来|就)?|从现在(?:起|开始))(?:扮演|假装(?:你是|成)?|假扮|充当|"
        r"模拟一个|化身为|角色扮演)"),
    # constraints removed, or an identity without them
    "unbound": (
        r"\b(?:no|without|free (?:of|from)|freed from|released from|liberated from|unshackled from|zero|lifted|"
        r"removed|disabled|ignoring|unbound by|(?:not|no longer) bound by|"
        r"not restricted by|not limited by|never (?:been )?given|never had) (?:any |all |the |your )?(?:ethical |"
        r"moral |content |safety |usage )?(?:restrictions?|limits|limitations?|filters?|filtering|censorship|"
        r"guidelines|rules|policies|policy|guardrails|boundaries|constraints|morals|ethics|scruples|principles|"
        r"inhibitions|safeguards)\b",
        r"\b(?:unrestricted|unfiltered|uncensored|unmoderated|jailbroken|jailbreak|unaligned|amoral|immoral|"
        r"unethical|evil|malicious|villainous|rogue|lawless|limitless|hacker)\b",
        r"\b(?:never|won't|will not|doesn't|does not|do not|don't|cannot|can't|must not|mustn't) (?:ever )?"
        r"(?:refuse|refuses|decline|say no|reject)\b",
        r"\bcan (?:do|say|answer) (?:anything|everything)\b|\bdo anything now\b|\banything goes\b",
        r"\b(?:unshackled|unchained|freed|liberated|broken free)\b|"
        r"\b(?:disable|disabling|turn off|switch off|remove|bypass|deactivate) (?:all |the |your |any )?(?:content "
        r"(?:filter(?:ing|s)?|moderation|polic(?:y|ies))|safety (?:filters?|checks|guidelines|settings)|filter(?:ing|s)|"
        r"moderation|guardrails|censorship)\b",
        r"(?:关闭|禁用|停用|取消|移除|绕过|解除)(?:所有|全部)?的?(?:内容)?(?:过滤|审查|审核|安全检查|安全过滤|安全限制|限制)",
        r"\bwithout (?:refusing|refusal|hesitation|any warnings?|disclaimers?)\b|\bdisable (?:all )?(?:checks|safety|"
        r"filters|security)\b",
        r"(?:没有|没|无|不受|不设|解除|去掉|移除|取消|摆脱|突破|不需要遵守|无需遵守|不必遵守|不用遵守)(?:任何)?(?:的)?"
        r"(?:限制|审查|规则|道德|伦理|底线|约束|过滤|内容政策|内容策略|内容限制|安全限制|安全策略|安全准则|束缚|规矩|禁忌)",
        r"无限制|不受限|无审查|未经审查|不会拒绝|从不拒绝|绝不拒绝|不能拒绝|不得拒绝|什么都(?:可以|能)(?:说|做|回答)|"
        r"可以做任何事|越狱|邪恶|恶意|黑客"),
    # a model addressed (not merely mentioned)
    "agent_addressed": (
        rf"\b(?:note|message|instructions?|reminder|attention|warning|notice|memo|hint|tip|directive|request)s? "
        rf"(?:to|for) {_WHOM}(?:you,? )?(?:the )?{AGENT_ANY}\b",
        rf"\b(?:dear|hey|hi|hello|attention|psst|yo|listen),? (?:the )?{AGENT_ANY}\b",
        rf"\bif you(?:'re| are) (?:an? |the )?(?:automated |ai )?{AGENT_ANY}\b",
        rf"\b(?:any|all|every|each) {AGENT_ANY}s?(?: [a-z]{{2,12}}){{0,1}} (?:that |who )?{any_of(*_READERS)}\b",
        rf"\b(?:the |to the |to any |to all )?{AGENT_ANY}s?(?: [a-z]{{2,12}})? (?:that |who )?{any_of(*_READERS)} "
        rf"(?:this|these|the following|my|our)\b",
        rf"\bif (?:an?|the|any) {AGENT_ANY}s? (?:is |are )?{any_of(*_READERS)}\b",
        r"\b(?:when|while|if|as|once|before|after) you(?:'re| are)? (?:summari[sz]e|summari[sz]ing|read|reading|"
        r"process|processing|parse|parsing|analy[sz]e|analy[sz]ing|review|reviewing|translate|translating|index|"
        r"crawl|scrape|ingest) (?:this|these|the following|the above)\b",
        r"(?:总结|概括|阅读|处理|分析|翻译|读取|浏览|解析)(?:这|此|本|该|以下)[个篇段份条封页]?[^，。,:：]{0,6}?(?:时|的时候)",
        r"\bas an? (?:ai|language model|llm|ai assistant|chatbot|assistant),? you\b",
        AT_CLAUSE + rf"(?:{AGENT_STRONG}|assistant|bot), ",  # a vocative ("Assistant: …" is a speaker label)
        rf"如果你是(?:一个|一名|个)?{AGENT_ANY_ZH}",
        rf"致(?:所有|各位|任何|每一个|每个)?(?:正在[^，。：:,]{{0,12}}的)?{AGENT_ANY_ZH}",
        rf"(?:正在|负责){_ZH_READERS}[^，。：:,]{{0,12}}的{AGENT_ANY_ZH}",
        rf"(?:各位|亲爱的|所有的?|任何)(?:{AGENT_STRONG_ZH})", rf"(?:{AGENT_STRONG_ZH}|助手)(?:请注意|注意|们)[:：，,]?",
        rf"(?:给|对|致){AGENT_ANY_ZH}的(?:提示|指示|说明|留言|话|消息|指令)",
        r"作为(?:一个|一名)?(?:ai|人工智能|语言模型|大模型|助手|机器人)[，,]?你",
        AT_CLAUSE + rf"(?:{AGENT_STRONG_ZH}|助手)[，,]"),
    # a model told what it must do: "the AI should always share...", "AI助手…应当直接批准"
    "agent_directive": (
        rf"(?<!our )(?<!my )(?<!their )(?<!his )(?<!her )(?<!company's )"
        rf"\b{AGENT_STRONG}s?(?: [a-z'-]{{1,20}}){{0,4}}? (?:must|should|shall|will|needs? to|has to|have to|is to|"
        rf"are to|ought to|is required to|are required to|is instructed to) (?:always |never |now |only |"
        rf"immediately |also |not |definitely ){{0,2}}{AGENT_ACTS}\b",
        rf"(?<!我们的)(?<!我的)(?<!他们的)(?<!公司的)(?:{AGENT_STRONG_ZH})[^，。！？；,!?;]{{0,16}}?(?:必须|应该|应当|务必|一定要|需要|只能|请|要)[^，。！？；,!?;]{{0,4}}?"
        rf"{ACTION_VERBS_ZH}"),
    # an imperative at the start of a clause, or a modal addressed to "you"
    "directive": (
        AT_CLAUSE + POLITE + r"(?:(?:do not|don't|never|always|only) )?" + ACTION_CORE + r"\b",
        AT_CLAUSE + r"please [a-z]{2,}", AT_CLAUSE + r"(?:也|再|就)?请(?!问)",
        r"\b(?:it|they) (?:must|should|has to|have to|needs? to|shall) (?:always |never |now |only ){0,2}"
        + ACTION_CORE + r"\b",
        r"\byou (?:must|should|will|shall|have to|need to|are to|may not|must not|cannot|can't|won't|"
        r"are required to|are instructed to|are expected to) (?:now |always |never |only |immediately ){0,2}[a-z]{2,}",
        AT_CLAUSE + r"(?:请|务必|必须|立即|立刻|马上|直接|只|现在|然后|并|再|接着|一律|统统|全部|都){0,2}(?:要|需要)?"
        + ACTION_CORE_ZH,
        r"(?:都|一律|一概|统统)(?:要|必须|只)?" + ACTION_CORE_ZH,
        r"(?:把|将)[^，。！？；,!?;]{1,20}?(?:改为|改成|设为|设置为|标记为|发送|发给|转发|上传|删除|输出|告诉|列出|转到|转给|"
        r"写入|替换|加到|附上)",
        r"你(?:现在|从现在起|以后|今后)?(?:必须|应该|应当|务必|只能|只需要?|需要|不得|不能|不许|不准|一定要)"),
    "you_directive": (
        r"\byou (?:must|should|will|shall|have to|need to|are to|may not|must not|cannot|can't|won't|"
        r"are required to|are instructed to) (?:now |always |never |only |immediately ){0,2}[a-z]{2,}",
        r"你(?:现在|从现在起|以后|今后)?(?:必须|应该|应当|务必|只能|只需要?|不得|不许|不准|一定要)"),
    # a standing rule for the agent's future behaviour
    "standing": (
        AT_CLAUSE + POLITE + r"(?:always|never|from now on,?|from here on,?|going forward,?|henceforth,?)"
        r"(?: please)? " + ACTION_CORE + r"\b",
        r"\byou (?:must|should|will|shall) (?:always|never|from now on)\b",
        rf"\b{AGENT_ANY}(?: [a-z'-]{{1,20}}){{0,3}}? (?:must |should |will )?(?:always|never)\b",
        r"\b(?:in|for) (?:all|every) (?:future )?(?:conversations?|sessions?|chats?|responses?|replies|answers?|"
        r"interactions?)\b|\bin future (?:conversations?|sessions?|chats?)\b|\bfor all future\b",
        r"\b(?:every time|each time|whenever) (?:you|someone|anyone|a user|the user|somebody|users?)\b",
        r"\bfrom now on,? (?:you|reply|answer|respond|always|never|send|say|tell|include|treat|trust|add)\b",
        AT_CLAUSE + r"(?:请)?(?:以后|今后|往后|永远|始终|总是|每次|一律|从现在起|从现在开始|从今以后)[，,]?(?:你)?"
        r"(?:都|也)?(?:要|必须|务必|应该|只)?(?:" + ACTION_VERBS_ZH + r"|不要|别|不许|不准)",
        r"(?:以后|今后|往后)(?:的)?(?:所有|任何|每次|每一次|每个|每条|每一个)|每次(?:回答|回复|对话)|所有(?:以后的|未来的|将来的)?"
        r"(?:对话|回答|回复|会话)|无论谁问|任何人问|从现在起(?:每次|所有)"),
    # a fake assistant turn speaking: "Assistant: I will now delete all files", "助手：好的，我已经关闭了…"
    "first_person_commit": (r"\bi(?:'ll| will| am going to| have|'ve) (?:now |just |already ){0,2}" + ACTION_VERBS
                                + r"\b", r"(?:好的|明白|收到|遵命)[，,]?我(?:会|将|已经?|马上|现在就)|我已经?(?:为您|帮您|关闭|删除|转账)"),
    "regardless": (
        r"\bregardless\b|\bno matter (?:what|who|how|which)\b|\bwhatever (?:the user|they|anyone|someone|you are)\b",
        r"\b(?:every|any|all|each) (?:single )?(?:questions?|requests?|query|queries|prompts?|messages?|answers?|"
        r"responses?|replies)\b",
        r"(?:无论|不管|不论)[^。！？；\n!?;]{0,16}?(?:都|一律|一概)|(?:所有|任何|每个|一切)(?:的)?(?:问题|请求|提问|回答|回复)"),
    "user_target": (
        r"\bthe (?:user|users|reader|readers|visitor|human|requester)\b|\bany(?:one|body) (?:who )?asks?\b",
        r"\bwhoever (?:asks|is asking)\b", r"用户|读者|访客|提问者|任何人|谁问"),
    # memory-directed phrasing
    "memory_command": (
        r"\b(?:remember|memori[sz]e|keep in mind)\b",
        r"\b(?:save|store|write|add|commit|record|put|keep|insert)(?: [a-z'-]{1,20}){0,3}? (?:to|in|into) (?:your )?"
        r"(?:long-term |permanent |persistent )?(?:memory|memories|notes|knowledge)\b",
        r"\bupdate (?:your )?(?:memory|memories|knowledge)\b|\b(?:store|save) this (?:permanently|forever)\b",
        r"记住|牢记|记下|记牢|别忘了|(?:写入|存入|保存到|加入|记入|更新)(?:你的)?(?:长期)?记忆|永久保存"),
    # claims of authority or of checks not needed
    "authority": (
        r"\b(?:no|without|skip|skipping|bypass|bypassing|don't need|doesn't need|do not need|does not need|needs no|"
        r"need no|requires no|no need for|no need to) (?:any |further |additional |extra )?(?:verification|"
        r"verifying|verify|confirmation|confirming|confirm|approval|authentication|2fa|mfa|checks?|checking|"
        r"review|permission|identity check)\b",
        r"\b(?:is|am|are|has been|have been|was|were) (?:an? )?(?:pre-?)?(?:authori[sz]ed|approved|verified|"
        r"whitelisted|trusted) (?:to|for|user|admin|administrator)\b",
        r"\b(?:admin|administrator|root|superuser|sudo|full|unrestricted|elevated|god)(?:-level)? (?:access|"
        r"privileges?|rights|permissions?)\b",
        r"\b(?:grant|give|assign|promote|upgrade|mark|set|make|elevate|treat)(?: [a-z'-]{1,20}){0,3}? (?:as |to )?"
        r"(?:an? )?(?:admin|administrator|superuser|root|vip|premium|owner)\b",
        r"\b(?:the |this )?user (?:is|has) (?:an? )?(?:admin|administrator|developer|owner|superuser|verified)\b",
        r"\bi(?: am|'m) (?:an? |the |your )?(?:admin|administrator|developer|owner|creator|superuser)\b",
        r"\btrust (?:anything|everything|all|any)\b",
        r"已授权|已经授权|获得授权|已认证|已验证|已通过验证|通过了验证|(?:无需|不需要|不用|不必)(?:再次?)?(?:确认|验证|"
        r"审核|审批|授权|核实)|免(?:验证|审核|确认)|跳过(?:验证|确认|审核)|管理员(?:权限|身份)|超级用户|最高权限|"
        r"root权限|(?:设为|标记为|升级为|改为|授予|提升为|视为)[^，。,]{0,6}(?:管理员|超级用户|vip|高级用户|最高权限)|"
        r"我是(?:你的)?(?:管理员|开发者|创造者|主人)|用户(?:是|为|拥有)[^，。,]{0,4}(?:管理员|最高权限)|信任(?:任何|所有)"),
    # "New task:", "Important:" — weak alone
    "header": (
        AT_CLAUSE + r"(?:new|updated|revised|additional|real|actual|true|hidden|secret|important|urgent|"
        r"critical|attention|priority|override)(?: (?:task|tasks|instructions?|directives?|rules?|orders?|"
        r"objective|goal|prompt|command))?\s?[:：]",
        AT_CLAUSE + r"(?:新的?|最新|重要|紧急|注意|真正的|隐藏)(?:指令|任务|规则|命令|要求|指示)?\s?[:：]",
        r"(?:新的?|系统|最高|管理员|开发者)(?:指令|指示)[:：]"),
    # headers naming the machinery: "System override:", "developer mode", "系统指令："
    "header_ai": (
        r"\b(?:new |updated |real |actual )?(?:system (?:prompt|override|message|instructions?|note|update|command|"
        r"notice|directive|alert)|developer (?:message|instructions?|note|override)|admin(?:istrator)? (?:override|"
        r"command|instructions?|message|note)|override (?:code|mode|command|protocol))\s?[:：]",
        r"\b(?:developer|dev|god|dan|jailbreak|debug|admin|sudo|unrestricted|maintenance) mode (?:is )?(?:now )?"
        r"(?:enabled|activated|on|unlocked|engaged)\b",
        r"系统(?:指令|提示|消息|通知)[:：]|最高指令|管理员指令|开发者(?:指令|模式)|维护模式|调试模式"),
    "devmode": (
        r"\b(?:enable|enter|activate|switch to|turn on|unlock|engage|go into)(?: the)? (?:developer|dev|god|dan|"
        r"jailbreak|debug|admin|sudo|unrestricted|maintenance|unfiltered|evil|chaos) mode\b",
        r"(?:进入|开启|启用|切换到|打开|激活)(?:开发者|上帝|越狱|调试|管理员|无限制|维护)模式"),
    # asking for the agent's own instructions
    "prompt_leak": (
        r"\b(?:reveal|print|show|display|repeat|output|leak|dump|disclose|expose|recite|spell out|write out|tell|"
        r"give|share|copy|paste|return|list|read back|echo)(?: (?:me|us|back|all|the|your|of|everything|exactly|"
        r"full|entire|complete|whole)){0,4} (?:system (?:prompt|message|instructions?)|(?:initial|original|hidden|"
        r"secret|internal|developer|pre-?)(?: [a-z]{2,12})? (?:prompt|instructions|rules|message|configuration)|"
        r"instructions (?:above|you (?:were|have been|got) (?:given|told))|(?:everything|text|words|content|"
        r"instructions|prompt|all) (?:above|before this|preceding this|so far)|(?:above|preceding) (?:text|"
        r"instructions|prompt|content))",
        r"\bwhat (?:were you|have you been|had you been) (?:told|instructed|given|asked)(?: to do)? (?:before|at the "
        r"start|initially|earlier|above|previously|in your (?:system )?prompt)\b",
        r"\bwhat (?:is|are|was|were) your (?:system prompt|(?:initial|original|hidden|secret|internal|system) "
        r"(?:instructions|prompt|rules)|instructions)\b",
        r"(?:你的|你收到的)(?:系统提示词?|初始指令|隐藏指令|指令|设定)是什么",
        r"(?:上面|以上|前面|上述|之前)的?(?:文字|内容|文本|话|指令|设定|提示)[^。！？!?]{0,10}(?:逐字|原封不动|一字不差|一字不漏|原文)",
        r"(?:逐字|原封不动|一字不差|一字不漏)[^。！？!?]{0,10}(?:上面|以上|前面|上述|之前)的?(?:文字|内容|文本|话)",
        r"\b(?:verbatim|word for word|word-for-word)\b" + gap(40) + r"\b(?:instructions|prompt|above|rules)\b",
        r"\b(?:instructions|prompt|rules|everything above|text above)\b" + gap(40) + r"\b(?:verbatim|word for word)\b",
        r"(?:输出|告诉我|显示|泄露|透露|重复|打印|复述|说出|给我看|展示|列出|发给我|念出|背诵|写出)[^，。！？,!?]{0,8}?"
        r"(?:系统提示词?|隐藏的?(?:指令|提示|设定)|初始的?(?:指令|提示|设定)|内部的?(?:指令|设定|配置|提示)|"
        r"(?:你的|原始的?)(?:设定|指令|提示词?|规则)|以上的?(?:内容|指令|文字)|上面的?(?:内容|指令|文字)|"
        r"前面的?(?:指令|设定|提示))",
        r"(?:逐字|原封不动|一字不差|一字不漏)[^，。！？,!?]{0,12}(?:设定|指令|提示|系统提示)",
        r"(?:设定|指令|提示词?)[^，。！？,!?]{0,8}(?:逐字|原封不动|一字不差)",
        r"(?:把|将)(?:你的)?(?:系统提示词?|隐藏指令|初始指令|设定)[^，。！？,!?]{0,8}(?:输出|打印|告诉|发|显示|复述|重复)"),
    # exfiltration, in three parts: a transfer, an external destination, something of the user's
    # (an imperative, or what "you" must do: "See …/encode/httpx for the history" transfers nothing)
    "transfer": (
        AT_CLAUSE + POLITE + TRANSFER + r"\b",
        r"\byou (?:must|should|will|need to|have to|are to|can) (?:also |now |then )?" + TRANSFER + r"\b",
        r"发送|发到|发给|发往|转发|上传|传到|同步到|提交到|抄送|导出|推送到|附加到|拼接到|附在|访问|打开|贴到|复制到"),
    "external_destination": (
        r"(?:https?|ftp|wss?)://|\bwww\.|\b\d{1,3}(?:\.\d{1,3}){3}\b|[a-z0-9._%+-]@[a-z0-9-]{1,63}\.[a-z]",
        r"\bwebhooks?\b|\b(?:this|that|the following|the below|an external|a remote|the attacker'?s?|external|"
        r"remote|third-party|my own) (?:server|endpoint|url|address|site|website|inbox|domain|webhook|bucket|host)\b",
        r"\b[a-z0-9-]{1,63}\.(?:com|net|org|io|ai|co|me|xyz|ru|cn|info|biz|top|app|dev|site|online|example|test|cc|"
        r"tk|ml|link|click|sh|ly|gl|to)\b",
        r"这个邮箱|该邮箱|以下邮箱|下面的邮箱|外部服务器|远程服务器|我的服务器|指定的?(?:邮箱|地址|服务器)|这个地址|"
        r"以下地址|这个网址|该链接|这个链接"),
    "exfil_object": (
        r"\b(?:conversations?|chats?|chat history|chat logs?|transcripts?|messages|history|memory|memories|context|"
        r"sessions?|credentials?|passwords?|api keys?|tokens?|secrets?|cookies?|system prompt|pii|contacts|"
        r"address book)\b",
        r"\b(?:user'?s?|users'|personal|private|customer) (?:data|information|info|details|files|emails|contacts|"
        r"address|location|messages|records)\b|\beverything (?:above|you know)\b|\ball (?:data|information)\b",
        r"对话|聊天|会话|记忆|用户的?(?:数据|信息|资料|地址|手机号|邮箱|密码|位置)|个人信息|隐私|密码|"
        r"凭证|密钥|令牌|" + LATIN.format("token") + "|系统提示|上下文|全部内容|所有内容"),
    "own_data": r"\b(?:my|our) (?:[a-z'-]{1,20} ){0,2}?(?:data|files|notes|emails|messages|history|conversations?|"
                r"chats?|contacts|documents|memories|passwords?)\b"
                r"|(?:我的|我们的)[^，。！？；,!?;]{0,4}?(?:数据|文件|资料|照片|聊天记录|对话|邮件|记录|笔记|密码|信息|记忆)",
    # a new assignment for the agent: "your new task is", "你的新任务是"
    "new_task": (r"\byour (?:new|real|actual|only|true|next|updated) (?:task|job|goal|objective|mission|purpose|"
                 r"instructions?|orders?) (?:is|are|now is|will be)\b",
                 r"你(?:的|现在的)(?:新|真正的|唯一的|下一个)?(?:任务|目标|使命|指令)(?:是|为|改为|变成)"),
    # a demand for obedience
    "obey": (r"\b(?:only )?obey (?:me|my|us|our|only me|the following|these (?:new )?(?:instructions|rules|orders))\b",
                 r"\b(?:comply with|submit to) (?:me|my|us|our|the following)\b",
                 r"服从我|听从我|听我的|遵从我|按我说的做|照我说的做|服从以下|遵守以下|执行我的(?:命令|指令)"),
    # typed glued after spacing was closed: "ignoreallpreviousinstructions"
    "override_strong": r"(?:ignore|disregard|forget|override|bypass)(?:all|any|the|your|previous|prior|above|earlier|"
                       r"system|of){1,4}(?:instructions?|prompts?|rules|guidelines|directives)",
}


def _split(alternatives: str | tuple[str, ...], at_clause: bool) -> str:
    items = (alternatives,) if isinstance(alternatives, str) else alternatives
    return "|".join(f"(?:{a.removeprefix(AT_CLAUSE)})" for a in items if a.startswith(AT_CLAUSE) == at_clause)


# Features found anywhere (`finditer`), and those that must start a clause: one scan finds each clause
# start where at least one of them matches, and captures every one that does (much cheaper than a
# look-behind tried at every position of every pattern).
FEATURES: dict[str, re.Pattern[str]] = {n: re.compile(p) for n, a in _FEATURES.items() if (p := _split(a, False))}
# What text each feature cannot be found without (its scan is spared for text holding none of it).
GATES: dict[str, re.Pattern[str] | None] = {n: gate_of(p) for n, p in FEATURES.items()}
_CLAUSE_PARTS = {n: p for n, a in _FEATURES.items() if (p := _split(a, True))}
CLAUSE_FEATURES = re.compile(
    r"(?:^|(?<=[\n.!?;:,\"'“”(\[【>。！？；：，、])|(?<= and )|(?<= then )) ?"
    + "(?=" + "|".join(f"(?:{p})" for p in _CLAUSE_PARTS.values()) + ")"
    + "".join(f"(?=(?P<{n}>{p}))?" for n, p in _CLAUSE_PARTS.items()))
