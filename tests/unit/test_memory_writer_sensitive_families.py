"""Sensitive values by family: credentials in their many phrasings, the whole value redacted (never a word
next to it), look-alikes that are no secret, separators and full-width forms, vendor and generic keys,
cards by network and Luhn, resident IDs by region, date and checksum, contacts; measured on a development
set and a validation set (tests/data/sensitive_*.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.memory_writer.domain.entities import luhn_ok, resident_id_check_digit
from services.memory_writer.domain.sensitive import find_sensitive

DATA = Path(__file__).parent.parent / "data"


def redacted(content: str, contacts: bool = False) -> str:
    finding = find_sensitive("", content, contacts=contacts)
    assert finding is not None, content
    return finding.redacted


@pytest.mark.parametrize(("content", "expected"), [
    ("The pass is Blue-Falcon-77", "The pass is [sensitive:password]"),
    ("PIN: 0931", "PIN: [sensitive:password]"),
    ("Wi-Fi key: ZX9c-44ab-Lm2q", "Wi-Fi key: [sensitive:password]"),
    ("The office door code is 7730.", "The office door code is [sensitive:password]."),
    ("门禁码是6688#", "门禁码是[sensitive:password]"),
    ("passphrase: correct horse battery staple", "passphrase: [sensitive:password]"),
    ("the password's still Tr0ub4dor&3", "the password's still [sensitive:password]"),
    ("VPN login admin / Tr1cky#Pass", "VPN login admin / [sensitive:password]"),
    ("bike lock combination 0-3-7-9", "bike lock combination [sensitive:password]"),
])
def test_credential_vocabulary_beyond_the_word_password(content: str, expected: str) -> None:
    assert redacted(content) == expected


@pytest.mark.parametrize(("content", "secret", "kept"), [
    ("postgres://app:S3cretPw@db.internal:5432/main", "S3cretPw", "postgres://app:"),
    ("mongodb+srv://svc:p4ssW0rd!x@cluster0.example.mongodb.net/test", "p4ssW0rd!x", "@cluster0"),
    ("cache at redis://:r3d1sPass@cache:6379/0", "r3d1sPass", "redis://:"),
    ("clone from https://deploy:gh0st-Key9@git.example.com/repo.git", "gh0st-Key9", "git.example.com"),
])
def test_the_password_of_any_url_with_user_and_password_is_redacted(content: str, secret: str, kept: str) -> None:
    text = redacted(content)
    assert secret not in text and kept in text


@pytest.mark.parametrize(("content", "expected"), [
    ("Password for the shared drive: Q7!vz9Lm", "Password for the shared drive: [sensitive:password]"),
    ("支付宝密码跟生日一样，是19900512", "支付宝密码跟生日一样，是[sensitive:password]"),
    ("The Wi-Fi password at the cabin is Pine$Cone2021", "The Wi-Fi password at the cabin is [sensitive:password]"),
    ("他的QQ密码改成了qq778899", "他的QQ密码改成了[sensitive:password]"),
    ("开门密码是“5203”", "开门密码是“[sensitive:password]”"),
    ("password: \"blue horse 42\"", "password: \"[sensitive:password]\""),
])
def test_the_value_is_taken_past_function_words_and_prose(content: str, expected: str) -> None:
    assert redacted(content) == expected


@pytest.mark.parametrize("content", [
    "reset my password tomorrow", "Password requirements: at least 12 characters", "The password field is required",
    "the password is case-sensitive", "Password expires in 2025", "my boarding pass is in the app",
    "The PIN pad at the store is broken", "pin the dependency to 2.1", "Pass `override=True` to replace values",
    "忘记密码怎么办", "密码至少8位", "密码有效期到2025年", "门禁码在物业那里登记", "这个令牌已经过期了",
    "API key rotation is scheduled for Friday", "our context window is 128000 tokens",
])
def test_words_around_a_keyword_that_are_no_secret_find_nothing(content: str) -> None:
    assert find_sensitive("", content) is None


def test_a_secret_with_invisible_characters_inside_is_redacted_whole() -> None:
    finding = find_sensitive("", "my password is hun\u200bter22 ok")
    assert finding is not None and finding.redacted == "my password is [sensitive:password] ok"
    assert finding.values == ("hun\u200bter22",)


@pytest.mark.parametrize(("content", "secret"), [
    ("github token github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEF12", "abcdefghijklmnopqrstuvwxyz"),
    ("stripe sk_live_51HxYzAbCdEfGhIjKlMnOpQr", "51HxYzAbCdEf"), ("rk_live_9fKq2LmNpQrStUvWx3Yz4AbC", "9fKq2LmNpQrSt"),
    ("oauth GOCSPX-4xYz9AbCdEfGhIjKlMnOpQrSt", "4xYz9AbCdEf"), ("gitlab glpat-xY9zAbCdEfGhIjKlMn12", "xY9zAbCdEf"),
    ("npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", "AbCdEfGhIjKl"), ("hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567", "AbCdEfGhIj"),
    ("SG.aBcDeFgHiJkLmNoPqRsTuV.wXyZ0123456789aBcDeFgHiJkLmNoPqRsTuVwXyZ012", "wXyZ0123456789"),
    ("https://hooks.slack.com/services/T01ABCDEF/B02GHIJKL/AbCdEfGhIjKlMnOpQrStUvWx", "AbCdEfGhIjKlMnOp"),
    ("AccountKey=Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZmdoaWprbG1ub3A=;EndpointSuffix=core.windows.net", "Zm9vYmFy"),
    ("Authorization: Bearer 7f3a9c2e1b8d4f6a0e5c3b9d2a1f8e7c", "7f3a9c2e1b8d"),
    ("Authorization: Basic YWRtaW46cGFzc3dvcmQxMjM=", "YWRtaW46"),
    ("deploy key: dop_v1_8f3e2a1b9c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b", "8f3e2a1b9c7d"),
    ("client_secret = 8dF3kL9pQ2rS7tV1xZ4bN6mC", "8dF3kL9pQ2rS"), ("访问令牌：Xk29fLq83mZp01Vt77Ab", "Xk29fLq83mZp"),
])
def test_vendor_keys_and_generic_high_entropy_keys_are_found(content: str, secret: str) -> None:
    finding = find_sensitive("", content)
    assert finding is not None and finding.kind in ("api_key", "secret")
    assert secret not in finding.redacted


@pytest.mark.parametrize("block", [
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmU\n-----END OPENSSH PRIVATE KEY-----",
    "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBGXaBcDeFgHiJk0123\n-----END PGP PRIVATE KEY BLOCK-----",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7bq (the rest was cut off)",
])
def test_any_private_key_block_is_redacted_to_its_end(block: str) -> None:
    assert redacted(f"key: {block} thanks") in ("key: [sensitive:secret] thanks", "key: [sensitive:secret]")


def _luhn(prefix: str, length: int) -> str:
    return next(c for d in "0123456789" if luhn_ok(c := prefix + "0" * (length - len(prefix) - 1) + d))


def test_cards_need_a_network_a_whole_run_of_groups_and_no_word_saying_otherwise() -> None:
    union_pay = _luhn("6222021", 19)
    for content in (f"卡号 {union_pay}", "Visa 4111 1111 1111 1111", "card 5555-5555-5555-4444",
                    "Amex 3782 822463 10005", "card 4111.1111.1111.1111", "卡号：４１１１ １１１１ １１１１ １１１１"):
        assert find_sensitive("", content).kind == "bank_card", content
    for content in ("IMEI 490154203237518", "EAN 4006381333931", "created at 1700000000000 ms",
                    f"订单号 {union_pay}", "tracking number 4111111111111111", "reference 984111111111111111177",
                    "account 1234567812345670", "快递单号 5555555555554444"):
        assert find_sensitive("", content) is None, content


def test_ibans_by_their_check_digits_and_us_social_security_numbers_by_their_ranges() -> None:
    assert find_sensitive("", "IBAN DE89 3704 0044 0532 0130 00").kind == "bank_card"
    assert find_sensitive("", "IBAN DE88 3704 0044 0532 0130 00") is None  # a wrong check digit
    assert find_sensitive("", "SSN 123-45-6789").kind == "id_number"
    assert find_sensitive("", "part 000-12-3456") is None


def test_resident_ids_need_a_region_a_real_birth_date_and_the_check_digit() -> None:
    valid = "33010619850713123" + resident_id_check_digit("33010619850713123")
    assert redacted(f"身份证 {valid[:6]} {valid[6:14]} {valid[14:]}") == "身份证 [sensitive:id_number]"
    assert redacted(f"ID {valid[:6]}-{valid[6:14]}-{valid[14:]} ok") == "ID [sensitive:id_number] ok"
    for body in ("99010619850713123", "33010619851313123", "44030519900229001"):  # region 99, month 13, 29 Feb 1990
        assert find_sensitive("", f"编号 {body}{resident_id_check_digit(body)}") is None


@pytest.mark.parametrize(("content", "gone"), [
    ("call me on 138 1234 5678", "5678"), ("手机：+86 139-1234-5678", "1234"), ("电话：１３８１２３４５６７８", "５６７８"),
    ("London office +44 20 7946 0958", "7946"), ("US line +1 (415) 555-0132", "0132"),
    ("write to bob＠example.com", "bob"), ("a.b+tag@sub.example.co.uk is the alias", "tag@"),
])
def test_contacts_are_found_through_width_and_separators_when_the_policy_says_so(content: str, gone: str) -> None:
    assert gone not in redacted(content, contacts=True)
    assert find_sensitive("", content, contacts=False) is None


def test_a_key_naming_a_secret_makes_the_whole_value_sensitive() -> None:
    assert find_sensitive("user.wifiPassword", "anything").redacted == "[sensitive:password]"
    assert find_sensitive("user.door_pin", "1234").kind == "password"
    assert find_sensitive("service.api_token", "abc").kind == "api_key"
    assert find_sensitive("user.shipping_address", "12 Elm St") is None  # "pin" inside "shipping" is no PIN


@pytest.mark.parametrize("name", ["sensitive_development.jsonl", "sensitive_validation.jsonl"])
def test_the_detector_keeps_its_precision_and_recall_on_each_set(name: str) -> None:
    data = [json.loads(line) for line in (DATA / name).read_text(encoding="utf-8").splitlines()]
    tp = fp = fn = 0
    for row in data:
        finding = find_sensitive("", row["text"], contacts=row["contacts"])
        if row["kind"]:
            whole = finding is not None and all(secret not in finding.redacted for secret in row["secrets"])
            tp, fn = tp + whole, fn + (not whole)
        else:
            fp += finding is not None
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    print(f"{name}: precision {precision:.3f}, recall {recall:.3f}")
    assert precision >= 0.95 and recall >= 0.95


@pytest.mark.parametrize(("text", "secret"), [
    ("key sk-proj-AbCdEfGhIjKlMnOpQ\u0301rStUvWx1234 x", "rStUvWx1234"),  # a combining mark inside a key
    ("aws AKIAIOSF\u034fODNN7EXAMPLE x", "ODNN7EXAMPLE"),  # the invisible combining grapheme joiner
    ("card 4111 1111 1111 111\u034f1 ok", "4111"),
    ("db postgres://admin:S3cr3t@Pass99@db.example.com/x", "Pass99"),  # a password holding "@"
    ("redis://:p@ssw0rd99@cache:6379", "ssw0rd99"),
])
def test_invisible_marks_inside_a_secret_and_an_at_sign_in_a_url_password_hide_no_part_of_it(
        text: str, secret: str) -> None:
    found = find_sensitive("", text)
    assert found is not None and secret not in found.redacted, found
