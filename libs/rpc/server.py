"""gRPC server bootstrap on grpc.aio: health, reflection, the call pipeline, graceful shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from libs.auth import TokenVerifier
from libs.logs import get_logger
from libs.rpc.interceptors import CallPipeline

__all__ = ["GrpcServer", "PortInUse", "Registration"]

log = get_logger(__name__)


class PortInUse(Exception):
    pass


@dataclass(frozen=True)
class Registration:
    """One gRPC service: the generated `add_XServicer_to_server`, the servicer, its full name, its scopes."""

    add: Callable[[object, grpc.aio.Server], None]
    servicer: object
    name: str  # e.g. "mnemesh.v1.MemoryWriter"
    scopes: Mapping[str, str]  # method name -> scope, e.g. {"Write": "memory:write"}


class GrpcServer:
    def __init__(self, host: str, port: int, registrations: list[Registration],
                 verifier: TokenVerifier | None, *, default_deadline_seconds: float = 30.0) -> None:
        self.address = f"{host}:{port}"
        self.registrations = registrations
        method_scopes = {f"/{r.name}/{m}": s for r in registrations for m, s in r.scopes.items()}
        # so_reuseport off: a second process on the same port must fail, not share it silently.
        pipeline = CallPipeline(verifier, method_scopes, default_deadline_seconds)
        self.server = grpc.aio.server(interceptors=[pipeline],
                                      options=[("grpc.so_reuseport", 0)])
        self.health = health.aio.HealthServicer()
        self.ready, self.not_ready_reason, self._started = True, "", False

    async def start(self) -> None:
        for r in self.registrations:
            r.add(r.servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = [r.name for r in self.registrations]
        reflection.enable_server_reflection(
            [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
            self.server,
        )
        try:
            self.server.add_insecure_port(self.address)
        except RuntimeError as exc:
            raise PortInUse(f"cannot listen on {self.address}: {exc}; is another copy running? "
                            "stop it or set the service's MNEMESH_*_GRPC_PORT") from None
        await self.server.start()
        self._started = True
        await self._publish_health()
        log.info("grpc serving", address=self.address, services=names, ready=self.ready)

    async def set_ready(self, ready: bool, reason: str = "") -> None:
        """Readiness: NOT_SERVING (for every service name) while a dependency is away, SERVING again after.

        Before start() it only records the state, which start() then publishes; after stop() began,
        the health servicer ignores it (shutting down stays NOT_SERVING).
        """
        self.ready, self.not_ready_reason = ready, "" if ready else reason
        if self._started:
            await self._publish_health()

    async def _publish_health(self) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if self.ready else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ["", *(r.name for r in self.registrations)]:
            await self.health.set(name, status)

    async def stop(self, grace: float) -> None:
        """NOT_SERVING first (load balancers drain), then let in-flight calls finish within `grace`."""
        await self.health.enter_graceful_shutdown()
        if grace:
            await asyncio.sleep(min(0.5, grace))
        await self.server.stop(grace)
