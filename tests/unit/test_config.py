"""Settings are read once from the environment and an optional TOML file; bad ones are named."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.config import ConfigError, load_settings


def test_without_any_configuration_the_documented_defaults_apply() -> None:
    settings = load_settings()
    assert settings.grpc_port("retriever") == 50052
    assert settings.metrics_port("tool-gateway") == 9103
    assert settings.redis_url is None and settings.database_url is None


@pytest.mark.parametrize("value", ["not-a-port", "0", "70000"])
def test_a_bad_port_is_refused_naming_its_environment_variable(monkeypatch: pytest.MonkeyPatch,
                                                               value: str) -> None:
    monkeypatch.setenv("MNEMESH_RETRIEVER_GRPC_PORT", value)
    with pytest.raises(ConfigError, match="MNEMESH_RETRIEVER_GRPC_PORT"):
        load_settings()


def test_a_port_from_the_environment_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MNEMESH_RETRIEVER_GRPC_PORT", "6001")
    assert load_settings().grpc_port("retriever") == 6001


@pytest.mark.parametrize("url", ["http://localhost:6379", "localhost:6379"])
def test_a_redis_url_that_is_not_redis_is_refused_naming_redis_url(monkeypatch: pytest.MonkeyPatch,
                                                                   url: str) -> None:
    monkeypatch.setenv("REDIS_URL", url)
    with pytest.raises(ConfigError, match="REDIS_URL") as err:
        load_settings()
    assert "redis://" in str(err.value)


@pytest.mark.parametrize("url", ["redis://localhost:6379/0", "rediss://cache.example:6380", "unix:///tmp/r.sock"])
def test_redis_urls_with_a_redis_scheme_are_accepted(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("REDIS_URL", url)
    assert load_settings().redis_url == url


def test_a_database_url_that_is_not_postgresql_is_refused_naming_database_url(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "mysql://db/mnemesh")
    with pytest.raises(ConfigError, match="DATABASE_URL"):
        load_settings()


def test_a_config_file_that_does_not_exist_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    monkeypatch.setenv("MNEMESH_CONFIG", str(missing))
    with pytest.raises(ConfigError, match="MNEMESH_CONFIG") as err:
        load_settings()
    assert str(missing) in str(err.value)


def test_a_toml_file_sets_values_and_the_environment_overrides_them(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    config = tmp_path / "mnemesh.toml"
    config.write_text('host = "0.0.0.0"\nretriever_grpc_port = 6000\n', encoding="utf-8")
    monkeypatch.setenv("MNEMESH_CONFIG", str(config))

    from_file = load_settings()
    assert (from_file.host, from_file.retriever_grpc_port) == ("0.0.0.0", 6000)

    monkeypatch.setenv("MNEMESH_RETRIEVER_GRPC_PORT", "7000")
    overridden = load_settings()
    assert (overridden.host, overridden.retriever_grpc_port) == ("0.0.0.0", 7000)


def test_a_bad_value_in_the_toml_file_is_refused_naming_the_setting(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    config = tmp_path / "mnemesh.toml"
    config.write_text("retriever_grpc_port = 99999\n", encoding="utf-8")
    monkeypatch.setenv("MNEMESH_CONFIG", str(config))
    with pytest.raises(ConfigError, match="RETRIEVER_GRPC_PORT"):
        load_settings()


def test_every_bad_setting_is_named_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MNEMESH_RETRIEVER_GRPC_PORT", "x")
    monkeypatch.setenv("MNEMESH_LOG_LEVEL", "loud")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert "MNEMESH_RETRIEVER_GRPC_PORT" in str(err.value) and "MNEMESH_LOG_LEVEL" in str(err.value)


def test_a_jwt_secret_shorter_than_32_bytes_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MNEMESH_JWT_SECRET", "too-short-a-secret")
    with pytest.raises(ConfigError, match="MNEMESH_JWT_SECRET") as err:
        load_settings()
    assert "32 bytes" in str(err.value)


def test_a_refused_secret_is_not_repeated_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MNEMESH_JWT_SECRET", "too-short-a-secret")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert "too-short-a-secret" not in str(err.value)


def test_a_config_file_that_is_not_toml_is_refused_naming_the_file(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    bad = tmp_path / "mnemesh.toml"
    bad.write_text("log_level = \n")
    monkeypatch.setenv("MNEMESH_CONFIG", str(bad))
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_settings()


def test_a_misspelt_key_in_the_config_file_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    typo = tmp_path / "mnemesh.toml"
    typo.write_text('log_levle = "debug"\n')
    monkeypatch.setenv("MNEMESH_CONFIG", str(typo))
    with pytest.raises(ConfigError, match="unknown settings log_levle"):
        load_settings()


def test_a_url_is_printed_without_its_password() -> None:
    from libs.config import redacted

    assert redacted("postgresql://app:s3cret@db:5432/mnemesh") == "postgresql://app:***@db:5432/mnemesh"
    assert redacted("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
