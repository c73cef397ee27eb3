"""Memory as MCP tools: an agent remembers, recalls, confirms and forgets through the tool-gateway, with the
official MCP client, the calls going on to the real memory-writer and retriever (all three served in this
process against real PostgreSQL, Redis and the embedded vector engine)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import asyncpg
import httpx2
import pytest
import redis.asyncio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from libs.auth import issue_token
from libs.config import Settings, load_settings
from libs.runtime import run_service
from mnemesh.infra import free_port
from mnemesh.registry import load_bootstrap
from mnemesh.supervisor import check_health

pytestmark = pytest.mark.integration
SERVICES = ("memory-writer", "retriever", "tool-gateway")
MEMORY_TOOLS = {"memory.remember", "memory.recall", "memory.forget", "memory.confirm"}


@dataclass
class Mesh:
    settings: Settings

    def token(self, tenant: str, *scopes: str, subject: str = "agent-7") -> str:
        return issue_token(self.settings, subject=subject, tenant_id=tenant, scopes=list(scopes))

    def agent(self, token: str) -> Agent:
        return Agent(f"http://127.0.0.1:{self.settings.mcp_http_port}/mcp", token)


class Agent:
    """An MCP client session with a bearer token."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token

    async def __aenter__(self) -> Client:
        self.http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {self.token}"}, timeout=30)
        self.client = Client(streamable_http_client(self.url, http_client=self.http))
        return await self.client.__aenter__()

    async def __aexit__(self, *exc) -> None:
        await self.client.__aexit__(*exc)
        await self.http.aclose()


@pytest.fixture
async def mesh(redis_url: str, database_url: str, tmp_path) -> AsyncIterator[Mesh]:
    namespace = f"t{uuid.uuid4().hex[:8]}"
    ports = {f"{name.replace('-', '_')}_grpc_port": free_port() for name in SERVICES}
    settings = load_settings(redis_url=redis_url, database_url=database_url, data_dir=tmp_path, namespace=namespace,
                             metrics_enabled=False, outbox_poll_seconds=0.1, mcp_http_port=free_port(),
                             jwt_secret="memtools-test-secret-0123456789abcdef", **ports)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(run_service(name, settings, load_bootstrap(name).bootstrap,
                                             migrations_package=load_bootstrap(name).migrations, stop=stop))
             for name in SERVICES]
    with anyio.fail_after(90):
        for name in SERVICES:
            while not await check_health(f"127.0.0.1:{settings.grpc_port(name)}"):
                if any(t.done() for t in tasks):
                    await asyncio.gather(*tasks)  # raise the failure of the service that died
                await anyio.sleep(0.1)
    yield Mesh(settings)
    stop.set()
    await asyncio.gather(*tasks)
    client = redis.asyncio.from_url(redis_url)
    keys = [k async for k in client.scan_iter(match=f"{namespace}.*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()
    conn = await asyncpg.connect(database_url)
    try:
        for name in SERVICES:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{namespace}_{name.replace("-", "_")}" CASCADE')
    finally:
        await conn.close()


async def recalled(client: Client, query: str) -> dict[str, dict]:
    result = await client.call_tool("memory.recall", {"query": query, "limit": 10})
    assert not result.is_error, result.structured_content
    return {m["memory_id"]: m for m in result.structured_content["memories"]}


async def until(check, seconds: float = 30) -> None:
    with anyio.fail_after(seconds):
        while not await check():
            await anyio.sleep(0.2)


async def test_an_agent_remembers_recalls_confirms_and_forgets_through_mcp(mesh: Mesh) -> None:
    token = mesh.token("acme", "tools:read", "tools:call", "memory:write", "memory:read", "memory:forget")
    async with mesh.agent(token) as agent:
        listed = {t.name: t for t in (await agent.list_tools()).tools}
        assert MEMORY_TOOLS <= set(listed)
        assert listed["memory.remember"].input_schema["required"] == ["content"]

        stated = await agent.call_tool("memory.remember", {"content": "I prefer jasmine tea over coffee 我喜欢茉莉花茶",
                                                           "key": "drink.preference"})
        assert not stated.is_error, stated.structured_content
        stated_id = stated.structured_content["memory_id"]
        assert (stated.structured_content["status"], stated.structured_content["must_confirm"]) == ("stored", False)

        guessed = await agent.call_tool("memory.remember", {"content": "The user probably lives in Hangzhou",
                                                            "key": "home.city", "source": "model_inference"})
        guessed_id = guessed.structured_content["memory_id"]
        assert guessed.structured_content["must_confirm"] is True

        async def both_found() -> bool:
            return {stated_id} <= set(await recalled(agent, "jasmine tea")) and \
                guessed_id in await recalled(agent, "Hangzhou city")
        await until(both_found)
        memory = (await recalled(agent, "茉莉花茶"))[stated_id]
        assert (memory["key"], memory["confidence"]) == ("drink.preference", "l1_strong")
        assert (await recalled(agent, "Hangzhou city"))[guessed_id]["must_confirm"] is True

        confirmed = await agent.call_tool("memory.confirm", {"memory_id": guessed_id, "reason": "the user said so"})
        assert not confirmed.is_error, confirmed.structured_content
        assert confirmed.structured_content["confidence"] == "l1_strong"

        forgotten = await agent.call_tool("memory.forget", {"memory_id": stated_id})
        assert forgotten.structured_content == {"forgotten": 1}

        async def gone() -> bool:
            return stated_id not in await recalled(agent, "jasmine tea")
        await until(gone)

    # Memories are the tenant's: another tenant's agent finds nothing of them.
    async with mesh.agent(mesh.token("globex", "tools:read", "tools:call", "memory:read")) as other:
        assert guessed_id not in await recalled(other, "Hangzhou city")


async def test_memory_tools_need_the_memory_scope_and_say_what_is_wrong(mesh: Mesh) -> None:
    async with mesh.agent(mesh.token("acme", "tools:read", "tools:call", "memory:read")) as agent:
        refused = await agent.call_tool("memory.remember", {"content": "something"})
        assert refused.is_error and refused.structured_content["error_type"] == "permission_denied"
        bad = await agent.call_tool("memory.recall", {"query": ""})
        assert bad.is_error and bad.structured_content["error_type"] == "validation"
        assert "query" in bad.structured_content["field"]
    async with mesh.agent(mesh.token("acme", "tools:read", "tools:call", "memory:write")) as agent:
        unknown = await agent.call_tool("memory.confirm", {"memory_id": str(uuid.uuid4())})
        assert unknown.is_error and unknown.structured_content["error_type"] == "not_found"
