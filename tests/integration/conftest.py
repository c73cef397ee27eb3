"""Fixtures for tests against real Redis and PostgreSQL (`make test` provides them).

Each test gets its own PostgreSQL schema and its own stream names, so tests and
repeated runs never see each other's data.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
import redis.asyncio

from libs.db import APP_ROLE, Database, apply_migrations, load_migrations

pytestmark = pytest.mark.integration


def _required(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run the integration tests with `make test` (it provides Redis and "
                    "PostgreSQL), or point REDIS_URL and DATABASE_URL at servers", pytrace=False)
    return value


@pytest.fixture
def redis_url() -> str:
    return _required("REDIS_URL")


@pytest.fixture
def database_url() -> str:
    return _required("DATABASE_URL")


@pytest.fixture
def unique() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture
async def schema(database_url: str, unique: str) -> AsyncIterator[str]:
    """A fresh schema with the shared tables (event store, outbox, processed events)."""
    name = f"test_{unique}"
    await apply_migrations(database_url, name, load_migrations())
    yield name
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await conn.close()


@pytest.fixture
def as_owner(database_url: str, schema: str):
    """Run DDL in the test's schema as its owner (the services' role may not), then let the services' role
    use what it created: `await as_owner("CREATE TABLE effects (...)")`."""

    async def run(statements: str) -> None:
        conn = await asyncpg.connect(database_url, server_settings={"search_path": f"{schema},public"})
        try:
            await conn.execute(statements)
            await conn.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{schema}" TO {APP_ROLE};'
                               f' GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA "{schema}" TO {APP_ROLE}')
        finally:
            await conn.close()

    return run


@pytest.fixture
async def db(database_url: str, schema: str) -> AsyncIterator[Database]:
    database = Database(database_url, schema, max_size=30)
    await database.open()
    yield database
    await database.close()


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def redis_factory(redis_client: redis.asyncio.Redis, unique: str) -> AsyncIterator:
    """A factory answering the test's Redis client (what the gateway's Redis adapters take), with `unique`
    as their namespace: the keys under it are deleted afterwards."""
    async def client() -> redis.asyncio.Redis:
        return redis_client
    yield client
    keys = [k async for k in redis_client.scan_iter(match=f"{unique}.*")]
    if keys:
        await redis_client.delete(*keys)


@pytest.fixture
async def streams(redis_client: redis.asyncio.Redis, unique: str) -> AsyncIterator[str]:
    """A stream-name prefix for this test; its streams are deleted afterwards."""
    prefix = f"test.{unique}"
    yield prefix
    keys = [k async for k in redis_client.scan_iter(match=f"{prefix}*")]
    if keys:
        await redis_client.delete(*keys)
