"""Entity value formats (property-based): valid values accepted and normalised, near misses refused
with a message naming the field and saying what is wrong."""

from __future__ import annotations

import calendar
from datetime import date

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libs.errors import ValidationFailed
from services.memory_writer.domain.entities import a_date as the_date
from services.memory_writer.domain.entities import (
    amount,
    bank_card,
    check_entity,
    cn_mobile,
    cn_resident_id,
    email,
    format_of,
    luhn_ok,
    resident_id_check_digit,
)

digits = st.text(alphabet="0123456789", min_size=1, max_size=1)


def refused(check, value: str) -> ValidationFailed:
    with pytest.raises(ValidationFailed) as err:
        check(value)
    assert err.value.field == "content" and err.value.reason and err.value.hint
    return err.value


# --- Chinese mobile numbers ---------------------------------------------------------------------------------

PREFIXES = ["130", "139", "145", "150", "153", "166", "170", "178", "180", "189", "191", "199"]
mobiles = st.builds(lambda p, rest: p + rest, st.sampled_from(PREFIXES), st.text("0123456789", min_size=8,
                                                                                 max_size=8))


@given(mobiles, st.sampled_from(["{}", "+86{}", "+86 {}", "0086{}", "{0} {1} {2}", "{0}-{1}-{2}", "８６{}"]))
def test_a_chinese_mobile_number_is_accepted_in_any_usual_spelling_and_stored_as_11_digits(number, style) -> None:
    if "{0}" in style:
        text = style.format(number[:3], number[3:7], number[7:])
    elif style.startswith("８６"):
        text = "".join(chr(ord(c) + 0xFEE0) for c in "86" + number)  # full-width digits
    else:
        text = style.format(number)
    assert cn_mobile(text) == number


@given(mobiles, st.integers(0, 10))
def test_a_mobile_number_with_a_digit_missing_is_refused_saying_how_many_digits_it_has(number, at) -> None:
    error = refused(cn_mobile, number[:at] + number[at + 1:])
    assert error.reason == "the phone number has 10 digits; Chinese mobile numbers have 11"


@given(mobiles, digits)
def test_a_mobile_number_with_a_digit_too_many_is_refused(number, extra) -> None:
    assert "12 digits" in refused(cn_mobile, number + extra).reason


@given(st.sampled_from(["10", "11", "12", "20", "90"]), st.text("0123456789", min_size=9, max_size=9))
def test_a_mobile_number_with_a_prefix_no_operator_uses_is_refused(prefix, rest) -> None:
    assert "prefix" in refused(cn_mobile, prefix + rest).reason


@given(mobiles, st.sampled_from("abcO一"))
def test_a_mobile_number_holding_a_letter_is_refused_naming_it(number, letter) -> None:
    assert repr(letter) in refused(cn_mobile, number[:5] + letter + number[6:]).reason


# --- e-mail -------------------------------------------------------------------------------------------------

label = st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=12)
emails = st.builds(lambda user, host, tld: f"{user}@{host}.{tld}", st.from_regex(r"[a-z0-9]+([._+-][a-z0-9]+)*",
                                                                              fullmatch=True).filter(
    lambda s: len(s) <= 64), label, st.text("abcdefghijklmnopqrstuvwxyz", min_size=2, max_size=6))


@given(emails)
def test_a_well_formed_email_is_accepted(address) -> None:
    assert email(address) == address


@given(emails)
def test_an_email_without_its_at_sign_is_refused_saying_so(address) -> None:
    assert refused(email, address.replace("@", "")).reason == "the e-mail address has no @"


@given(emails)
def test_an_email_with_two_at_signs_or_no_top_level_domain_is_refused(address) -> None:
    refused(email, address.replace("@", "@@"))
    refused(email, address.rsplit(".", 1)[0])


# --- dates --------------------------------------------------------------------------------------------------

dates = st.dates(min_value=date(1900, 1, 1), max_value=date(2200, 12, 31))


@given(dates, st.sampled_from(["{y}-{m:02d}-{d:02d}", "{y}/{m}/{d}", "{y}年{m}月{d}日", "{y}.{m:02d}.{d:02d}"]))
def test_a_real_date_is_accepted_in_usual_spellings_and_stored_as_iso(day, style) -> None:
    assert the_date(style.format(y=day.year, m=day.month, d=day.day)) == day.isoformat()


@given(dates)
def test_the_day_after_the_last_of_a_month_is_refused_saying_how_many_days_the_month_has(day) -> None:
    last = calendar.monthrange(day.year, day.month)[1]
    error = refused(the_date, f"{day.year}-{day.month:02d}-{last + 1}")
    assert f"has {last} days" in error.reason


@given(dates, st.integers(13, 99))
def test_a_month_past_december_is_refused(day, month) -> None:
    assert "months are 1 to 12" in refused(the_date, f"{day.year}-{month}-{day.day}").reason


# --- amounts ------------------------------------------------------------------------------------------------

cents = st.integers(0, 10**12)


@given(cents, st.sampled_from(["{a} CNY", "¥{a}", "￥{a}", "{a}元", "USD {a}", "${a}", "{a} eur"]))
def test_an_amount_with_a_currency_is_accepted_and_stored_with_its_code(value, style) -> None:
    text = f"{value // 100}.{value % 100:02d}"
    stored = amount(style.format(a=text))
    number, code = stored.split(" ")
    assert number == text and code in {"CNY", "USD", "EUR"}


@given(cents)
def test_an_amount_without_a_currency_is_refused_saying_so(value) -> None:
    assert refused(amount, f"{value / 100:.2f}").reason == "the amount has no currency"


@given(cents, st.integers(1, 9))
def test_an_amount_with_more_decimals_than_its_currency_has_is_refused(value, extra) -> None:
    assert "decimal places" in refused(amount, f"{value // 100}.{value % 100:02d}{extra} CNY").reason


# --- Chinese resident ID numbers ----------------------------------------------------------------------------

ids = st.builds(
    lambda region, area, born, seq: (lambda body: body + resident_id_check_digit(body))(
        f"{region}{area}{born:%Y%m%d}{seq}"),
    st.sampled_from([11, 31, 33, 44, 51, 65]), st.text("0123456789", min_size=4, max_size=4),
    st.dates(min_value=date(1900, 1, 1), max_value=date(2100, 12, 31)), st.text("0123456789", min_size=3, max_size=3))


@given(ids)
def test_a_resident_id_with_its_check_digit_is_accepted(number) -> None:
    assert cn_resident_id(number.lower()) == number


@given(ids, st.sampled_from("0123456789X"))
def test_a_resident_id_with_another_check_digit_is_refused_without_quoting_its_digits(number, other) -> None:
    if other == number[-1]:
        return
    error = refused(cn_resident_id, number[:-1] + other)
    assert "check digit" in error.reason
    assert not any(ch.isdigit() for ch in error.reason.replace("17", "").replace("14", "").replace(" 7 ", ""))


@given(ids, st.integers(0, 16), st.integers(1, 9))
def test_a_resident_id_with_one_digit_changed_is_refused(number, at, delta) -> None:
    changed = number[:at] + str((int(number[at]) + delta) % 10) + number[at + 1:]
    refused(cn_resident_id, changed)


@given(ids)
def test_a_resident_id_one_character_short_is_refused_saying_it_has_17(number) -> None:
    assert "has 17 characters" in refused(cn_resident_id, number[:-1]).reason


# --- bank cards ---------------------------------------------------------------------------------------------


def with_luhn(body: str) -> str:
    return next(body + d for d in "0123456789" if luhn_ok(body + d))


cards = st.text("0123456789", min_size=11, max_size=18).map(with_luhn)


@given(cards)
def test_a_card_number_passing_luhn_is_accepted_with_spaces_removed(number) -> None:
    spaced = " ".join(number[i:i + 4] for i in range(0, len(number), 4))
    assert bank_card(spaced) == number


@given(cards, st.data())
def test_a_card_number_with_one_digit_changed_is_refused_by_its_check_digit(number, data) -> None:
    at = data.draw(st.integers(0, len(number) - 1))
    delta = data.draw(st.integers(1, 9))
    changed = number[:at] + str((int(number[at]) + delta) % 10) + number[at + 1:]
    assert "Luhn" in refused(bank_card, changed).reason


# --- choosing the format ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "fmt"), [("user.phone", cn_mobile), ("billing.email", email),
                                          ("contract.start_date", the_date), ("order.amount", amount),
                                          ("user.id_card", cn_resident_id), ("user.bank_card", bank_card),
                                          ("user.nickname", None)])
def test_the_format_follows_the_last_segment_of_the_key(key, fmt) -> None:
    assert format_of(key) is fmt


@given(st.text(min_size=1, max_size=40))
def test_a_key_without_a_format_keeps_any_value_unchanged(value) -> None:
    assert check_entity("user.nickname", value) == value


def test_a_tenant_schema_for_a_key_replaces_the_built_in_format() -> None:
    schema = {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}
    assert check_entity("user.phone", '{"city": "杭州"}', schema) == '{"city": "杭州"}'
    with pytest.raises(ValidationFailed) as err:
        check_entity("user.address", '{"street": "西湖路"}', schema)
    assert "'city' is a required property" in err.value.reason and err.value.field == "content"
