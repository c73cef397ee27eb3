"""Upstream MCP servers: what configures one, and the rules an added one must pass. No I/O."""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field

from libs.errors import PermissionDenied, ValidationFailed

__all__ = ["UpstreamConfig", "UpstreamStatus", "check_upstream", "config_from_dict", "config_to_dict",
           "load_upstreams"]

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_PREFIX = re.compile(r"^([a-z][a-z0-9_]*)?$")


@dataclass(frozen=True)
class UpstreamConfig:
    name: str  # lower_snake_case; the backend is `mcp:<name>/<tool>`
    command: list[str] = field(default_factory=list)  # stdio: the command line
    url: str = ""  # Streamable HTTP
    prefix: str | None = None  # None: the name; "": no prefix
    env: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    timeout_seconds: float = 30.0
    scopes: tuple[str, ...] = ()
    mode: str = "auto"  # the SDK client's: "auto" (2026-07-28 when served) or "legacy" (the 2025 handshake)


@dataclass
class UpstreamStatus:
    state: str = "connecting"  # "up", "down", "connecting"
    reason: str = ""
    restarts: int = 0
    tools: int = 0


def config_from_dict(item: dict) -> UpstreamConfig:
    return UpstreamConfig(**{**item, "scopes": tuple(item.get("scopes", ()))})


def config_to_dict(config: UpstreamConfig) -> dict:
    return {**asdict(config), "scopes": list(config.scopes)}


def load_upstreams(text: str) -> list[UpstreamConfig]:
    """`{"upstreams": [{"name": "time", "command": ["uvx", "mcp-server-time"]}, ...]}`"""
    return [config_from_dict(item) for item in json.loads(text).get("upstreams", [])]


def check_upstream(config: UpstreamConfig, allowed_commands: frozenset[str]) -> UpstreamConfig:
    """Refuse an upstream added at run time that is malformed, or that would run a program not allowed.

    A stdio upstream runs a command on every gateway host: only executables the operators listed
    (MNEMESH_TOOL_UPSTREAM_COMMANDS) may be started through the API; the config file is not limited.
    """
    if not _NAME.match(config.name):
        raise ValidationFailed("must be lower_snake_case, at most 32 characters", field="upstream.name")
    if bool(config.command) == bool(config.url):
        raise ValidationFailed("needs exactly one of command (stdio) and url (Streamable HTTP)",
                               field="upstream.command")
    if config.url and not re.match(r"^https?://[^\s/]+", config.url):
        raise ValidationFailed("must be an http:// or https:// URL", field="upstream.url")
    if config.prefix is not None and not _PREFIX.match(config.prefix):
        raise ValidationFailed("must be lower_snake_case (or empty for none)", field="upstream.prefix")
    if config.mode not in ("auto", "legacy"):
        raise ValidationFailed("must be auto or legacy", field="upstream.mode")
    if not 0 < config.timeout_seconds <= 600:
        raise ValidationFailed("must be between 0 and 600 seconds", field="upstream.timeout_seconds")
    if config.command and os.path.basename(config.command[0]) not in allowed_commands:
        raise PermissionDenied(f"this gateway does not start {os.path.basename(config.command[0])!r} for "
                               "upstreams added at run time", field="upstream.command",
                               hint="operators list the executables allowed in MNEMESH_TOOL_UPSTREAM_COMMANDS "
                                    "(e.g. uvx,npx), or use a Streamable HTTP url")
    return config
