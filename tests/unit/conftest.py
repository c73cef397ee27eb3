"""Unit tests run with no Mnemesh settings from the developer's shell, so they mean the same everywhere."""

from __future__ import annotations

import os

import pytest

_CONVENTIONAL = ("REDIS_URL", "DATABASE_URL", "QDRANT_URL", "OTEL_EXPORTER_OTLP_ENDPOINT")


@pytest.fixture(autouse=True)
def _clean_settings_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("MNEMESH_") or name.upper() in _CONVENTIONAL:
            monkeypatch.delenv(name)
