"""Master-key providers: a local key file, and PKCS#11 against a real SoftHSM2 token.

SoftHSM2 (Debian package `softhsm2`) must be installed: CI's `.ci/run` installs it. The token
lives in a temporary directory of this test run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from libs.crypto import CryptoError, LocalKeyFile, Pkcs11Provider, new_key

pytestmark = pytest.mark.integration
SOFTHSM_LIBRARY = "/usr/lib/softhsm/libsofthsm2.so"


@pytest.fixture(scope="module")
def softhsm_token(tmp_path_factory) -> tuple[str, str]:
    if not Path(SOFTHSM_LIBRARY).exists() or shutil.which("softhsm2-util") is None:
        # A system package (an HSM emulator), not something `make setup` can install as a user: CI's .ci/run
        # installs it, so there these tests always run.
        pytest.skip("SoftHSM2 is not installed: `apt-get install -y softhsm2` to run the PKCS#11 tests")
    home = tmp_path_factory.mktemp("softhsm")
    (home / "tokens").mkdir()
    conf = home / "softhsm2.conf"
    conf.write_text(f"directories.tokendir = {home / 'tokens'}\nobjectstore.backend = file\n")
    os.environ["SOFTHSM2_CONF"] = str(conf)  # read by the library when it initialises, in this process
    label = f"mnemesh-{uuid.uuid4().hex[:6]}"
    subprocess.run(["softhsm2-util", "--init-token", "--free", "--label", label, "--pin", "1234", "--so-pin",
                    "5678"], check=True, capture_output=True)
    return label, "1234"


def test_the_pkcs11_provider_wraps_in_the_token_and_only_its_key_unwraps(softhsm_token) -> None:
    label, pin = softhsm_token
    hsm = Pkcs11Provider(SOFTHSM_LIBRARY, label, pin, "master", create=True)
    data_key = new_key()
    wrapped = hsm.wrap(data_key, b"tenant:acme")
    assert data_key not in wrapped and len(wrapped) == 12 + 32 + 16
    assert hsm.unwrap(wrapped, b"tenant:acme") == data_key
    with pytest.raises(CryptoError):
        hsm.unwrap(wrapped, b"tenant:globex")  # the context is bound to the wrapping
    other = Pkcs11Provider(SOFTHSM_LIBRARY, label, pin, "another-master", create=True)
    with pytest.raises(CryptoError):
        other.unwrap(wrapped, b"tenant:acme")
    assert hsm.key_id == f"pkcs11:{label}/master"


def test_the_pkcs11_master_key_is_found_again_by_label_and_cannot_be_extracted(softhsm_token) -> None:
    import pkcs11
    from pkcs11 import Attribute

    label, pin = softhsm_token
    first = Pkcs11Provider(SOFTHSM_LIBRARY, label, pin, "durable", create=True)
    wrapped = first.wrap(b"k" * 32, b"ctx")
    first.close()
    again = Pkcs11Provider(SOFTHSM_LIBRARY, label, pin, "durable")  # create=False: must exist already
    assert again.unwrap(wrapped, b"ctx") == b"k" * 32
    assert again._key[Attribute.EXTRACTABLE] is False and again._key[Attribute.SENSITIVE] is True
    with pytest.raises(pkcs11.exceptions.NoSuchKey):
        Pkcs11Provider(SOFTHSM_LIBRARY, label, pin, "never-created")


def test_a_local_key_file_is_created_private_and_refuses_a_foreign_wrapping(tmp_path) -> None:
    provider = LocalKeyFile(tmp_path / "keys" / "master.key", create=True)
    assert (tmp_path / "keys" / "master.key").stat().st_mode & 0o777 == 0o600
    wrapped = provider.wrap(b"d" * 32, b"user:u1")
    assert LocalKeyFile(tmp_path / "keys" / "master.key").unwrap(wrapped, b"user:u1") == b"d" * 32
    with pytest.raises(CryptoError):
        LocalKeyFile(tmp_path / "other.key", create=True).unwrap(wrapped, b"user:u1")
    with pytest.raises(FileNotFoundError):
        LocalKeyFile(tmp_path / "missing.key")


def test_processes_starting_together_create_one_local_key_and_all_read_it_whole(tmp_path) -> None:
    """Two memory-writer processes of one `mnemesh run` start together on one data folder."""
    import sys

    script = ("import sys; from libs.crypto import LocalKeyFile; "
              "print(LocalKeyFile(sys.argv[1], create=True).key_id)")
    for round_ in range(5):
        path = tmp_path / f"r{round_}" / "master.key"
        racers = [subprocess.Popen([sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True) for _ in range(6)]
        outcomes = [(p.wait(60), *p.communicate()) for p in racers]
        assert [code for code, _, _ in outcomes] == [0] * 6, [err for _, _, err in outcomes]
        assert len({out for _, out, _ in outcomes}) == 1  # one key, read whole by all
        assert sorted(p.name for p in path.parent.iterdir()) == ["master.key"]  # no spare file left
        assert path.stat().st_mode & 0o777 == 0o600
