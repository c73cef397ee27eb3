"""Numbers and addresses that identify a person: resident ID numbers, bank cards, phone numbers, e-mail
addresses (no I/O). Spans are in folded text (`textfold.fold`: full-width digits and "＠" are ASCII).

- Also US social security numbers written 3-2-4 with valid ranges, passport numbers after "passport"/"护照",
  and IBANs with a valid ISO 13616 check (reported as bank_card: an account, like a card, moves money).
- Resident IDs: 18 characters (groups of 6-8-4 may be separated by a space, a hyphen or a dot) with a real province
  code, a real birth date and the right check digit — a checksum alone passes one random number in eleven.
- Bank cards: a whole run of digit groups (never digits inside a longer run) whose length and leading digits
  fit a card network, with a valid Luhn digit, and no word nearby saying it is something else (IMEI, EAN,
  ISBN, an order or a tracking number, 订单, 快递单号).
- Phones: Chinese mobiles, international numbers written with "+", North American numbers written with
  separators, Chinese landlines with an area code, and digits after a phone word ("tel", "电话").
- E-mail addresses: found from each "@" (a local part of at most 64 characters before it).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterator

from services.memory_writer.domain.entities import PROVINCES, luhn_ok, resident_id_check_digit

__all__ = ["contacts", "identity_numbers"]

Span = tuple[int, int, str]

_RESIDENT_ID = re.compile(r"(?<![0-9A-Za-z.\-])(\d{6})[ .\-]?(\d{8})[ .\-]?(\d{3}[\dXx])(?![0-9A-Za-z]|[.\-]\d)")
_IBAN = re.compile(r"(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?(?![A-Za-z0-9])")
_SSN = re.compile(r"(?<![0-9A-Za-z\-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![0-9A-Za-z\-])")
_PASSPORT = re.compile(r"(?:passport|护照)(?: ?(?:no\.?|number|num|#|id))?(?:号码|号)?[^A-Za-z0-9\n]{0,6}"
                       r"([A-Z]{1,2}\d{6,9})(?![A-Za-z0-9])", re.IGNORECASE)
_DIGIT_RUN = re.compile(r"(?<![0-9A-Za-z])\d+(?:[ .\-]\d+)*")
_NOT_A_CARD = re.compile(
    r"imei|meid|ean|upc|isbn|issn|gtin|order|tracking|invoice|serial|s/n|\bsn\b|ref(?:erence)?|ticket|waybill|awb|"
    r"parcel|shipment|barcode|订单|快递|运单|物流|单号|编号|流水号|序列号|批次|发票|工单|条形码|条码", re.IGNORECASE)
_CN_MOBILE = re.compile(r"(?<![0-9])(?:(?:\+|00)86[ .\-]?)?1[3-9]\d(?:[ .\-]?\d){8}(?![0-9])")
_E164 = re.compile(r"(?<![\w+])\+\d{8,15}(?![\d])|(?<![\w+])\+\d{1,4}(?:[ .\-]{1,2}\(?\d{1,6}\)?){1,6}(?![\d])")
_NANP = re.compile(r"(?<![\w(])\(?[2-9]\d{2}\)?[ .\-]\d{3}[ .\-]\d{4}(?![\d])")
_CN_LANDLINE = re.compile(r"(?<![\d\-])0\d{2,3}-\d{7,8}(?![\d\-])")
_PHONE_WORD = re.compile(r"(?<![A-Za-z])(?:phone|tel|telephone|mobile|cell|whatsapp|wechat|fax)(?![A-Za-z])|"
                         r"电话|手机|联系方式|座机|微信", re.IGNORECASE)
_AFTER_PHONE_WORD = re.compile(r"[^0-9\n]{0,12}?(\+?\d[\d \-]{5,18}\d)(?![\d])")
_LOCAL_PART = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._%+-")
_DOMAIN = re.compile(r"(?:[A-Za-z0-9\-]{1,63}\.){1,8}[A-Za-z]{2,24}(?![A-Za-z0-9\-])")


def _real_date(year: int, month: int, day: int) -> bool:
    try:
        born = datetime.date(year, month, day)
    except ValueError:
        return False
    return born.year >= 1880


def identity_numbers(text: str) -> Iterator[Span]:
    """Resident ID numbers and bank cards."""
    for m in _RESIDENT_ID.finditer(text):
        region, birth, tail = m.groups()
        body = region + birth + tail[:3]
        if (int(region[:2]) in PROVINCES and _real_date(int(birth[:4]), int(birth[4:6]), int(birth[6:]))
                and resident_id_check_digit(body) == tail[3].upper()):
            yield m.start(), m.end(), "id_number"
    for m in _SSN.finditer(text):
        yield m.start(), m.end(), "id_number"
    for m in _PASSPORT.finditer(text):
        yield m.start(1), m.end(1), "id_number"
    for m in _IBAN.finditer(text):
        if _iban_ok(m.group(0).replace(" ", "")):
            yield m.start(), m.end(), "bank_card"
    for m in _DIGIT_RUN.finditer(text):
        if m.end() - m.start() >= 14:  # fewer characters cannot hold a card's 14 digits
            yield from _cards(text, m)


def _iban_ok(iban: str) -> bool:
    """ISO 13616: 15 to 34 characters whose rearranged number is 1 modulo 97."""
    if not 15 <= len(iban) <= 34:
        return False
    rearranged = iban[4:] + iban[:4]
    return int("".join(str(int(c, 36)) for c in rearranged)) % 97 == 1


def _network(digits: str) -> bool:
    """Whether a card network issues numbers of this length starting with these digits."""
    n, two, three, four = len(digits), int(digits[:2]), int(digits[:3]), int(digits[:4])
    return ((digits[0] == "4" and n in (16, 19))  # Visa
            or ((51 <= two <= 55 or 2221 <= four <= 2720) and n == 16)  # Mastercard
            or (two in (34, 37) and n == 15)  # American Express
            or ((four == 6011 or 644 <= three <= 649 or two == 65) and 16 <= n <= 19)  # Discover
            or (3528 <= four <= 3589 and 16 <= n <= 19)  # JCB
            or ((300 <= three <= 305 or two in (36, 38, 39)) and 14 <= n <= 19)  # Diners Club
            or (two in (62, 81) and 16 <= n <= 19)  # UnionPay
            or (2200 <= four <= 2204 and 16 <= n <= 19)  # Mir
            or (four in (5018, 5020, 5038, 5893, 6304, 6759, 6761, 6762, 6763) and 16 <= n <= 19))  # Maestro


def _cards(text: str, run: re.Match[str]) -> Iterator[Span]:
    """Card numbers in a run of digit groups: the whole run, or consecutive whole groups of it."""
    if run.end() < len(text) and text[run.end()].isalpha() and text[run.end()] < "\u0250":
        return  # glued to letters: a code, not a card
    if _NOT_A_CARD.search(text, max(0, run.start() - 24), run.start()):
        return
    groups = [(g.start(), g.end()) for g in re.finditer(r"\d+", run.group(0))]
    digits = "".join(run.group(0)[a:b] for a, b in groups)
    offsets = [0]
    for a, b in groups:
        offsets.append(offsets[-1] + b - a)
    i = 0
    while i < len(groups):
        first = offsets[i + 1] - offsets[i]
        if first < 4 and not 14 <= first <= 19:  # no card starts with a group of fewer than four digits
            i += 1
            continue
        end = i
        while end < len(groups) and offsets[end + 1] - offsets[i] <= 19:  # the most groups that fit a card
            end += 1
        for j in range(end, i, -1):
            number = digits[offsets[i]:offsets[j]]
            if len(number) < 14:
                break
            card_like = j - i == 1 or all(offsets[k + 1] - offsets[k] >= 3 for k in range(i, j - 1))
            if card_like and _network(number) and luhn_ok(number):
                yield run.start() + groups[i][0], run.start() + groups[j - 1][1], "bank_card"
                i = j - 1
                break
        i += 1


def contacts(text: str) -> Iterator[Span]:
    """Phone numbers and e-mail addresses."""
    for pattern in (_CN_MOBILE, _E164, _NANP, _CN_LANDLINE):
        for m in pattern.finditer(text):
            if 7 <= sum(c.isdigit() for c in m.group(0)) <= 15:
                yield m.start(), m.end(), "phone"
    for m in _PHONE_WORD.finditer(text):
        number = _AFTER_PHONE_WORD.match(text, m.end())
        if number and 7 <= sum(c.isdigit() for c in number.group(1)) <= 15:
            yield number.start(1), number.end(1), "phone"
    at = text.find("@")
    while at >= 0:
        start = at
        while start > 0 and at - start < 64 and text[start - 1] in _LOCAL_PART:
            start -= 1
        domain = _DOMAIN.match(text, at + 1)
        if start < at and domain and text[start] not in ".-":
            yield start, domain.end(), "email"
            at = text.find("@", domain.end())
        else:
            at = text.find("@", at + 1)
