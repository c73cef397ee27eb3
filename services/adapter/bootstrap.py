"""Wire the adapter."""

from __future__ import annotations

from libs.config import ConfigError
from libs.errors import ValidationFailed
from libs.runtime import ServiceContext
from services.adapter.domain.backends import parse_backends
from services.adapter.entrypoints import grpc_api

NAME = "adapter"
MIGRATIONS = None


async def bootstrap(ctx: ServiceContext) -> None:
    try:
        backends = parse_backends(ctx.settings.adapter_backends)
    except ValidationFailed as exc:
        raise ConfigError(f"{exc.field}: {exc.reason} ({exc.hint})") from None
    ctx.add_grpc(grpc_api.registration(backends))
