"""Wire the orchestrator: the session store, the rule book (hot-reloaded), memory, tools and the decider."""

from __future__ import annotations

from importlib.metadata import version

import httpx

from libs.auth import issue_token
from libs.http import serve_asgi
from libs.rpc.client import channel
from libs.runtime import ServiceContext
from libs.snapshots import SnapshotStore
from services.orchestrator.adapters.a2a_client import A2AAgents
from services.orchestrator.adapters.grpc_ports import GrpcMemoryWriter, GrpcRetriever, GrpcToolGateway
from services.orchestrator.adapters.llm import OpenAICompatible
from services.orchestrator.adapters.local import LocalMemory, LocalTools
from services.orchestrator.adapters.repository import EventSourcedSessions
from services.orchestrator.adapters.rules_file import RulesFile
from services.orchestrator.entrypoints import a2a, grpc_api
from services.orchestrator.service_layer import handlers
from services.orchestrator.service_layer.agent import Agent
from services.orchestrator.service_layer.delegation import OutcomeRecorder
from services.orchestrator.settings import OrchestratorSettings

NAME = "orchestrator"
MIGRATIONS = None


async def bootstrap(ctx: ServiceContext) -> None:
    own = OrchestratorSettings()
    rules = RulesFile(own.rules_file)

    def issue(tenant_id: str, scopes: list[str]) -> str:
        return issue_token(ctx.settings, subject="orchestrator", tenant_id=tenant_id, scopes=scopes, ttl_seconds=300)

    local_memory = LocalMemory()
    channels = {name: channel(address) for name, address in
                (("tools", own.tool_gateway), ("retriever", own.retriever), ("memory", own.memory_writer)) if address}
    for ch in channels.values():
        ctx.closers.append(ch.close)
    llm = None
    if own.llm_base_url:
        client = httpx.AsyncClient(base_url=own.llm_base_url, timeout=30.0)
        ctx.closers.append(client.aclose)
        llm = OpenAICompatible(client, own.llm_model, own.llm_api_key.get_secret_value())
    memory = GrpcMemoryWriter(channels["memory"], issue) if "memory" in channels else local_memory
    sessions = EventSourcedSessions(ctx.db, ctx.event_store, ctx.outbox, SnapshotStore(own.snapshot_every))
    agent = Agent(
        sessions, rules,
        GrpcRetriever(channels["retriever"], issue) if "retriever" in channels else local_memory,
        GrpcToolGateway(channels["tools"], issue) if "tools" in channels else LocalTools(),
        memory,
        llm, own.tool_deadline_seconds, own.turn_lease_seconds, verify_seconds=own.verify_seconds,
        agents=A2AAgents(issue, own.a2a_timeout_seconds), delegation_seconds=own.a2a_timeout_seconds)
    ctx.closers.append(agent.drain)  # closed first (closers run in reverse): turns end before the channels
    ctx.tasks.append(lambda: rules.watch(own.rules_check_seconds))
    ctx.add_grpc(grpc_api.registration(sessions, agent))
    if own.http_port:
        url = own.public_url or f"http://{ctx.settings.host}:{own.http_port}{a2a.A2A_PATH}"
        a2a_app = a2a.http_app(lambda cmd: handlers.send_message(cmd, sessions, agent), OutcomeRecorder(memory),
                               ctx.verifier, url, version("mnemesh"))

        async def serve_a2a() -> None:
            await serve_asgi(a2a_app, host=ctx.settings.host, port=own.http_port,
                             port_setting="MNEMESH_ORCHESTRATOR_HTTP_PORT")

        ctx.tasks.append(serve_a2a)
