"""Content-based detection of passwords: an English keyword is a word of its own, or ends a longer name that a
separator follows; a Chinese keyword counts anywhere."""

from __future__ import annotations

import pytest

from services.memory_writer.domain.sensitive import find_sensitive


@pytest.mark.parametrize(("content", "redacted"), [
    ("my wifi password is hunter22", "my wifi password is [sensitive:password]"),
    ("db_password=s3cr3t!", "db_password=[sensitive:password]"),
    ("PWD: abc123", "PWD: [sensitive:password]"),
    ("the passcode 9981", "the passcode [sensitive:password]"),
    ("银行卡密码是654321", "银行卡密码是[sensitive:password]"),
    ("登录口令为：qwe789", "登录口令为：[sensitive:password]"),
    ("userPassword=hunter22", "userPassword=[sensitive:password]"),  # the end of a longer name, then a separator
    ("rootPassword: Tr0ub4dor&3", "rootPassword: [sensitive:password]"),
    ("DBPASSWORD=s3cr3t!", "DBPASSWORD=[sensitive:password]"),
    ("newpassword: abc123", "newpassword: [sensitive:password]"),
    ("mysqlpwd=abc123", "mysqlpwd=[sensitive:password]"),
    ("wifipassword is hunter22", "wifipassword is [sensitive:password]"),
])
def test_a_password_after_its_keyword_is_found_and_redacted(content: str, redacted: str) -> None:
    finding = find_sensitive("", content)
    assert finding is not None and finding.kind == "password"
    assert finding.redacted == redacted


@pytest.mark.parametrize("content", [
    "Load note tiupepwdxyzq",  # letters that happen to spell a keyword inside a word
    "we moved to passwordless login last spring",
    "the compwd module was renamed",
    "passwords are rotated every 90 days",
])
def test_a_keyword_inside_another_word_finds_nothing(content: str) -> None:
    assert find_sensitive("", content) is None
