"""`mnemesh memory ...` refuses an argument no request can carry with one line naming it, exit code 2, and
no traceback, before it mints a token or calls anything."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mnemesh.cli import main

# Bytes of argv that are not UTF-8 reach Python as lone surrogates (surrogateescape): b"\xff" is "\udcff".
NOT_UTF8 = "bad \udcff"


@pytest.mark.parametrize(("argv", "argument", "says"), [
    (["memory", "write", NOT_UTF8], "argument content", "is not valid UTF-8 (the byte 0xff at position 4)"),
    (["memory", "write", "fine", "--user", NOT_UTF8], "argument --user", "is not valid UTF-8"),
    (["memory", "write", "fine", "--tag", "ok", "--tag", NOT_UTF8], "argument --tag", "is not valid UTF-8"),
    (["memory", "write", "fine", "--key", NOT_UTF8], "argument --key", "is not valid UTF-8"),
    (["memory", "correct", "user.name", NOT_UTF8], "argument content", "is not valid UTF-8"),
    (["memory", "correct", "user.name", "Li", "--reason", NOT_UTF8], "argument --reason",
     "is not valid UTF-8"),
    (["memory", "get", NOT_UTF8], "argument memory_id", "is not valid UTF-8"),
    (["memory", "history", NOT_UTF8], "argument key", "is not valid UTF-8"),
    (["memory", "forget", "--for-user", NOT_UTF8], "argument --for-user", "is not valid UTF-8"),
    (["memory", "release", "x", "--reason", NOT_UTF8], "argument --reason", "is not valid UTF-8"),
    (["memory", "compress", NOT_UTF8], "argument session_id", "is not valid UTF-8"),
    (["memory", "forget-tenant", "--confirm", NOT_UTF8], "argument --confirm", "is not valid UTF-8"),
    (["memory", "search", NOT_UTF8], "argument query", "is not valid UTF-8"),
    (["memory", "get", "x", "--tenant", "a b"], "argument --tenant",
     "is 'a b'; a tenant id is 1-64 letters, digits, '_', '.' or '-'"),
    (["memory", "write", "fine", "--tenant", ""], "argument --tenant", "is ''; a tenant id is"),
    (["memory", "quarantine", "--limit", "99999999999"], "argument --limit",
     "is 99999999999; give 0 (means 50) to 500"),
    (["memory", "quarantine", "--limit", "-1"], "argument --limit", "is -1; give 0 (means 50) to 500"),
    (["memory", "search", "tea", "--limit", "4294967296"], "argument --limit", "give 0 (means 10) to 100"),
    (["memory", "search", "tea", "--limit", "many"], "argument --limit", "is 'many', not a whole number"),
])
def test_an_argument_no_request_can_carry_is_one_line_naming_it_with_exit_code_2(
    capsys, argv: list[str], argument: str, says: str,
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert err.count("\n") == 1 and err.startswith(f"mnemesh {' '.join(argv[:2])}: error: {argument}: ")
    assert says in err and "Traceback" not in err


def test_bytes_that_are_not_utf8_on_the_real_command_line_are_refused_in_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNEMESH_")}
    result = subprocess.run([sys.executable, "-m", "mnemesh", "memory", "write", b"bad \xff"], env=env,
                            capture_output=True, timeout=60)
    err = result.stderr.decode(errors="backslashreplace")
    assert result.returncode == 2, err
    assert err.splitlines() == [err.strip()] and "argument content: is not valid UTF-8 (the byte 0xff" in err
