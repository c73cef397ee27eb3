"""Credentials in free text: passwords and codes after their keyword, secrets in URLs, API keys and tokens,
private-key blocks (no I/O).

A password is taken after its keyword only when it looks like one — a quoted token, a PIN-length run of
digits, or a token mixing letters with digits or symbols — so "reset my password tomorrow", "Password
requirements:" and "忘记密码怎么办" find nothing. The value is the first token after the keyword and its
function words ("Password for the shared drive: Q7!vz9Lm" → after the colon; "the password's still X" →
X); in Chinese the first secret-looking token of the clause ("支付宝密码跟生日一样，是19900512"). Keys are
found by a vendor prefix, by a generic prefixed high-entropy shape, or after a key name ("client_secret =",
"访问令牌："). Every span is in the folded text given (`textfold.fold`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

__all__ = ["credentials"]

Span = tuple[int, int, str]
_I = re.IGNORECASE

_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----")
_URL_SECRET = re.compile(r"\b[a-z][a-z0-9+.\-]{1,20}://[^\s:/@]{0,256}:([^\s/]{1,256})@", _I)  # to the last @
_VENDOR_KEYS = re.compile(
    r"\bsk-(?:proj-|live-|test-|ant-(?:api\d\d-)?|svcacct-)?[A-Za-z0-9_\-]{16,}"
    r"|\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b|\bgh[pousr]_[A-Za-z0-9]{30,}"
    r"|\bgithub_pat_[A-Za-z0-9_]{22,}|\bxox[abposr]-[A-Za-z0-9\-]{10,}|\bxapp-[A-Za-z0-9\-]{20,}"
    r"|\bAIza[0-9A-Za-z_\-]{35}|\bya29\.[0-9A-Za-z_\-]{20,}|\bGOCSPX-[A-Za-z0-9_\-]{20,}|\bglpat-[A-Za-z0-9_\-]{20,}"
    r"|\bnpm_[A-Za-z0-9]{36}\b|\bhf_[A-Za-z0-9]{30,}|\bpypi-[A-Za-z0-9_\-]{50,}|\bLTAI[0-9A-Za-z]{12,20}\b"
    r"|\bAKID[0-9A-Za-z]{13,32}\b|\bSG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}"
    r"|(?<![A-Za-z0-9_\-])eyJ[A-Za-z0-9_\-]{10,}+\.[A-Za-z0-9_\-]{10,}+\.[A-Za-z0-9_\-]{5,}"
    r"|\bhttps://hooks\.slack\.com/services/[A-Za-z0-9/_\-]{20,}"
    r"|\bhttps://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/\d{5,}/[A-Za-z0-9_\-]{20,}")
_ASSIGNED_KEY = re.compile(r"\b(?:AccountKey|SharedAccessKey|SharedAccessSignature|sig|client_secret|"
                           r"aws_secret_access_key)=([A-Za-z0-9+/=%_\-]{16,})", _I)
_AUTHORIZATION = re.compile(r"\b(?:authorization:[ \t]{0,3}(?:basic|bearer|token|digest)|bearer)[ \t]{1,3}"
                            r"([A-Za-z0-9+/=._~\-]{8,})", _I)
# A lower-case vendor-like prefix, a separator, and a long random body: "sk_live_…", "dop_v1_…".
_PREFIXED = re.compile(r"(?<![A-Za-z0-9_\-])[A-Za-z]{2,12}(?:[_\-][A-Za-z0-9]{1,12}){0,2}[_\-]([A-Za-z0-9]{20,})"
                       r"(?![A-Za-z0-9])")
_KEY_NAME = re.compile(
    r"(?<![A-Za-z])(?:api[ _\-]?(?:key|secret|token)|apikey|access[ _\-]?(?:key(?:[ _\-]?(?:id|secret))?|token)|"
    r"secret(?:[ _\-]?(?:access[ _\-]?)?key)?|client[ _\-]?secret|auth(?:orization)?[ _\-]?(?:token|key)|"
    r"refresh[ _\-]?token|session[ _\-]?(?:token|key|id)|private[ _\-]?key|signing[ _\-]?key|credentials?|"
    r"app[ _\-]?secret|webhook[ _\-]?secret|token)(?![A-Za-z])|accesskey ?secret|密钥|秘钥|令牌|访问令牌|凭证|凭据",
    _I)
_KEY_VALUE = re.compile(r"[A-Za-z0-9+/=._~\-]{16,200}")

_PASSWORD_WORD = (r"pass(?:word|wd|code|phrase|key)?s?|pwd|pw|pin(?:[ \-]?(?:code|number|no\.?))?|"
                  r"(?:wi-?fi|wlan|wpa2?|network|wireless|router)[ \-]?(?:key|password|pass|code)|"
                  r"(?:door|gate|garage|alarm|lock|safe|building|keypad|entry|access|entrance|unlock|security|locker|"
                  r"padlock|lockbox)[ \-]?(?:code|combination|pin)|seed phrase|recovery phrase|mnemonic")
_PASSWORD = re.compile(
    rf"(?:(?<![A-Za-z0-9_])(?:{_PASSWORD_WORD})|[A-Za-z0-9_]{{1,30}}?(?:password|passwd|pwd|passcode|passphrase)"
    rf"(?=[ \t]{{0,3}}(?:[=:：]|is\b|was\b)))(?![A-Za-z])(?:'s)?"
    r"|密码|口令|门禁码|PIN码|pin码|解锁码|开锁码|安全码|助记词", _I)
_PHRASE_WORDS = ("phrase", "mnemonic", "助记词")
_ANY_VALUE = re.compile(r"[0-9A-Za-z]")
_AMBIGUOUS = frozenset({"pass", "passes", "pin", "pins", "pw", "passkey", "passkeys"})  # also verbs or other things: "pass `x`", "pin the version"
_STATED = re.compile(r"(?:'s)?[ \t]{0,3}(?:[=:：]|(?:is|was|still is|is still|remains|number|code|no\.?)\b|是|为)")
_CLAUSE_END = re.compile(r"\n|[。！？；]|[.;](?=\s|$)")  # "!" and "?" may end a password: they stay in it
_QUOTED = re.compile(r"[\"“‘「『`']([^\"”’」』`'\n]{1,64})[\"”’」』`']")
_LABEL = re.compile(r"[ \t]{1,3}(?:for|of|to|on|at|in|used for|给|的)\b|(?:给|的)")
_MARKER = re.compile(r"[ \t]{0,3}(?:[=:：]|\b(?:is|was|are)\b|是|为)[ \t]{0,3}")
_ASSIGNMENT = re.compile(r"[ \t]{0,3}(?:[=:：]|->|=>)[ \t]{0,3}")
_FILLER = re.compile(
    r"(?:[ \t]{1,3}|[=:：]|->|=>|,|\bis\b|\bwas\b|\bare\b|\bstill\b|\bnow\b|\bcurrently\b|\bremains\b|\bstays\b|"
    r"\bhas been\b|\bhad been\b|\bbecame\b|\bchanged to\b|\bset to\b|\breset to\b|\bupdated to\b|\bwill be\b|"
    r"\bof\b|\bto\b|\bthe\b|\bmy\b|\bour\b|\bhis\b|\bher\b|\btheir\b|\byour\b|\bnew\b|\bcurrent\b|\bjust\b|"
    r"是|为|改成了?|改为|换成了?|设为|设成|还是|就是|仍是|依然是|也是|都是)", _I)
_TOKEN = re.compile(r"[^\s，。,;；、\"'“”‘’()（）<>\[\]【】]{1,64}")
_ASCII_TOKEN = re.compile(r"[\x21-\x7e]{3,64}")
_UNIT_AFTER = re.compile(r"[年月日号点天次位个分秒小时岁元块]")
_NOT_VALUES = frozenset("none null n/a na tbd unknown required empty hidden redacted same changed reset".split())


def _entropy(value: str) -> float:
    counts = {ch: value.count(ch) for ch in set(value)}
    return -sum(c / len(value) * math.log2(c / len(value)) for c in counts.values())


def _random_looking(value: str) -> bool:
    """A key body: letters and digits mixed with the spread of random text (not a word, a number, a date)."""
    if not (any(c.isalpha() for c in value) and any(c.isdigit() for c in value)):
        return False
    return _entropy(value) >= 3.0


def _secret_looking(value: str, explicit: bool) -> bool:
    """A password-like value: a PIN-length digit run, letters with digits or symbols, mixed-case letters, or
    (right after an explicit `:`, `=`, "is", "是") a word of six letters or more."""
    if not 3 <= len(value) <= 64 or value.lower() in _NOT_VALUES or any(ord(c) > 0x2e7f for c in value):
        return False  # (Chinese prose is not a value)
    digits = re.sub(r"(?<=\d)[ .\-](?=\d)", "", value.rstrip("#*"))  # "0-3-7-9" is a PIN too
    if digits.isdigit():
        return 4 <= len(digits) <= 12
    letters = [c for c in value if c.isalpha()]
    if not letters:
        return False
    if any(c.isdigit() for c in value) or any(not c.isalnum() and c not in "-'._" for c in value):
        return len(value) >= 4
    mixed = any(c.isupper() for c in value[1:]) and any(c.islower() for c in value)
    return len(value) >= 6 and (mixed or explicit)


def _trimmed(text: str, start: int, end: int) -> tuple[int, int]:
    while end > start and text[end - 1] in ".,;:)]}，。":
        end -= 1
    return start, end


def _password_value(text: str, after: int, phrase: bool) -> tuple[int, int] | None:
    """Where the password after a keyword ending at `after` is, if one is there."""
    end_match = _CLAUSE_END.search(text, after, after + 120)
    clause_end = end_match.start() if end_match else min(len(text), after + 120)
    position, explicit = after, False
    assignment = _ASSIGNMENT.match(text, position)
    if assignment:
        position, explicit = assignment.end(), True
    elif _LABEL.match(text, position):  # "Password for the shared drive: X", "password at the cabin is X"
        marker = _MARKER.search(text, position, min(clause_end, position + 40))
        if marker:
            position, explicit = marker.end(), marker.group(0).strip() in ("=", ":", "：", "是", "为")
    if phrase:
        words = text[position:clause_end].strip()
        if len(words.split()) >= 2:
            start = text.index(words, position)
            return start, start + len(words)
    while (filler := _FILLER.match(text, position)) and filler.end() > position:
        explicit = explicit or filler.group(0).strip() in ("是", "为", ":", "：", "=")  # not "is": adjectives follow it
        position = filler.end()
    quoted = _QUOTED.match(text, position, clause_end)  # a quoted value where the value belongs
    if quoted:
        value = quoted.group(1).strip()
        spaced_ok = phrase or explicit or " " not in value  # a quoted passphrase after "password:"
        return (quoted.start(1), quoted.end(1)) if spaced_ok and _secret_looking(value, True) else None
    token = _TOKEN.match(text, position, clause_end)
    if token:
        start, end = _trimmed(text, token.start(), token.end())
        if _secret_looking(text[start:end], explicit and end == clause_end or explicit and _letters_end(text, end)):
            return start, end
    if not ("\u3400" <= text[position:position + 1] <= "\u9fff"):
        return None
    # Chinese prose after the keyword: the first secret-looking token of the clause.
    for candidate in _ASCII_TOKEN.finditer(text, position, clause_end):
        start, end = _trimmed(text, candidate.start(), candidate.end())
        if _UNIT_AFTER.match(text, end):
            continue
        if _secret_looking(text[start:end], False):
            return start, end
    return None


def _letters_end(text: str, end: int) -> bool:
    """Whether the value ends its clause (only spaces or punctuation follow before the clause ends)."""
    rest = text[end:end + 3]
    return not rest.strip() or rest[:1] in ",，。.;；"


def _passwords(text: str) -> Iterator[Span]:
    for m in _PASSWORD.finditer(text):
        word = m.group(0).lower()
        phrase = any(w in word for w in _PHRASE_WORDS)
        if word.removesuffix("'s") in _AMBIGUOUS and not _STATED.match(text, m.end()):
            continue
        if not _ANY_VALUE.search(text, m.end(), m.end() + 120):  # no letter or digit of a value follows
            continue
        found = _password_value(text, m.end(), phrase)
        if found:
            yield found[0], found[1], "password"
    # user / password pairs: "VPN login admin / Tr1cky#Pass", "root:Passw0rd!"
    for m in _PAIR.finditer(text):
        value = m.group(2).rstrip(".,;")
        context = text[max(0, m.start() - 40):m.start()].lower()
        who = m.group(1).lower()
        if _strong(value) and ("@" in who or who in _ADMIN_NAMES or _LOGIN_WORDS.search(context)):
            yield m.start(2), m.start(2) + len(value), "password"


_PAIR = re.compile(r"(?<![\w@./:\-])([\w.@+\-]{2,64})[ \t]{0,2}[/:][ \t]{0,2}([^\s/:]{6,64})(?![^\s,;，。])")
_ADMIN_NAMES = frozenset("admin administrator root sa postgres sysadmin superuser".split())
_LOGIN_WORDS = re.compile(r"\b(?:login|log in|sign in|credentials?|account|username|user|admin|root|ssh|vpn|ftp|"
                          r"database|db)\b|账号|账户|登录|用户名")


def _strong(value: str) -> bool:
    return sum((any(c.islower() for c in value), any(c.isupper() for c in value), any(c.isdigit() for c in value),
                any(not c.isalnum() for c in value))) >= 3


def _keys(text: str) -> Iterator[Span]:
    start = 0
    while (m := _PRIVATE_KEY.search(text, start)) is not None:
        end_marker = text.find("-----END", m.end())
        if end_marker < 0:
            yield m.start(), len(text), "secret"
            return
        close = text.find("-----", end_marker + 8)
        end = close + 5 if close >= 0 else len(text)
        yield m.start(), end, "secret"
        start = end
    for m in _VENDOR_KEYS.finditer(text):
        yield m.start(), m.end(), "api_key"
    for m in _ASSIGNED_KEY.finditer(text):
        yield m.start(1), m.end(1), "api_key"
    for m in _AUTHORIZATION.finditer(text):
        if m.group(0)[:1] in "Aa" or _random_looking(m.group(1)):  # a bare "bearer …" needs a random token
            yield m.start(1), m.end(1), "api_key"
    for m in _PREFIXED.finditer(text):
        if _random_looking(m.group(1)):
            yield m.start(), m.end(), "api_key"
    for m in _KEY_NAME.finditer(text):
        window_end = min(len(text), m.end() + 40)
        value = _KEY_VALUE.search(text, m.end(), window_end)
        if value and _random_looking(value.group(0)) and not re.search(r"[。！？\n]", text[m.end():value.start()]):
            kind = "secret" if re.search(r"secret|private|signing|credential|密钥|秘钥|凭", m.group(0), _I) else "api_key"
            yield value.start(), value.end(), kind
    for m in _URL_SECRET.finditer(text):
        yield m.start(1), m.end(1), "password"


def credentials(text: str) -> list[Span]:
    """Spans of passwords, secrets and keys in `text` (folded)."""
    return [*_keys(text), *_passwords(text)]
