"""Versioned migrations against real PostgreSQL: idempotent, per schema, tamper-evident."""

from __future__ import annotations

import asyncpg
import pytest

from libs.db import Migration, MigrationError, apply_migrations, load_migrations

pytestmark = pytest.mark.integration


async def test_applying_twice_applies_nothing_the_second_time(database_url: str, schema: str) -> None:
    everything = load_migrations("services.memory_writer")
    own = [m.version for m in everything if m.version >= 100]
    assert own[:3] == [100, 101, 102]
    assert await apply_migrations(database_url, schema, everything) == own  # the shared ones came with `schema`
    assert await apply_migrations(database_url, schema, everything) == []
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(f"SELECT version FROM {schema}.schema_migrations ORDER BY version")
    finally:
        await conn.close()
    assert [r[0] for r in rows] == [*(m.version for m in load_migrations()), *own]


async def test_a_migration_edited_after_it_was_applied_is_refused(database_url: str, schema: str) -> None:
    shared = load_migrations()
    edited = [*shared[:-1], Migration(shared[-1].version, shared[-1].name, shared[-1].sql + "\n-- edited")]
    with pytest.raises(MigrationError, match="changed after it was applied"):
        await apply_migrations(database_url, schema, edited)


def test_two_services_cannot_claim_the_same_migration_version() -> None:
    with pytest.raises(MigrationError, match="duplicate migration versions"):
        load_migrations("services.retriever", "services.retriever")
