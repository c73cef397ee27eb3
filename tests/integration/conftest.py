"""Fixtures for tests against real Redis and PostgreSQL (`make test` provides them).

Each test gets its own PostgreSQL schema and its own stream names, so tests and
repeated runs never see each other's data.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio
from psycopg import sql

from libs.db import Database, apply_migrations, load_migrations

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
    import psycopg

    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


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
async def streams(redis_client: redis.asyncio.Redis, unique: str) -> AsyncIterator[str]:
    """A stream-name prefix for this test; its streams are deleted afterwards."""
    prefix = f"test.{unique}"
    yield prefix
    keys = [k async for k in redis_client.scan_iter(match=f"{prefix}*")]
    if keys:
        await redis_client.delete(*keys)
