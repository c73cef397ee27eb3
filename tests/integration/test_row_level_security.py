"""Row-level security on real PostgreSQL: a query that forgets its tenant filter still sees one tenant."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime

import asyncpg
import pytest

from libs.db import Database, RoleError, apply_migrations, load_migrations
from libs.events import Envelope
from libs.eventstore import ANY_VERSION, EventStore
from libs.outbox import Outbox
from libs.protogen.mnemesh.v1 import events_pb2

pytestmark = pytest.mark.integration

# Every tenant-owned table, by the migrations that create it.
TABLES = {"services.memory_writer": ["events", "outbox", "memories", "entity_schemas", "tenant_keys",
                                     "user_keys"],
          "services.retriever": ["events", "outbox", "documents", "tombstones"]}


def event(tenant: str, text: str) -> Envelope:
    return Envelope.wrap(events_pb2.SessionMessageAppended(device_id="d", role="user", text=text),
                         event_type="session.message_appended", tenant_id=tenant)


async def insert_row(conn: asyncpg.Connection, table: str, tenant: str, store: EventStore, outbox: Outbox) -> None:
    """One row of `table` for `tenant`, written the way the services write it."""
    now = datetime.now(UTC)
    if table == "events":
        await store.append(conn, f"s-{uuid.uuid4().hex[:6]}", ANY_VERSION, [event(tenant, "x")])
    elif table == "outbox":
        await outbox.add(conn, event(tenant, "y"), stream="test.rls")
    elif table == "memories":
        await conn.execute("INSERT INTO memories (memory_id, tenant_id, user_id, layer, source, content, confidence,"
                           " created_at) VALUES ($1, $2, 'u', 5, 2, 'c', 1, $3)", uuid.uuid4(), tenant, now)
    elif table == "tenant_keys":
        await conn.execute("INSERT INTO tenant_keys (tenant_id, version, wrapped, search_wrapped, master_key_id)"
                           " VALUES ($1, $2, '\\x00', '\\x00', 'test')", tenant, random.randrange(10**9))
    elif table == "user_keys":
        await conn.execute("INSERT INTO user_keys (tenant_id, user_id, wrapped, tenant_version) VALUES ($1, $2,"
                           " '\\x00', 1)", tenant, uuid.uuid4().hex)
    elif table == "entity_schemas":
        await conn.execute("INSERT INTO entity_schemas (tenant_id, key, schema) VALUES ($1, $2, '{}')", tenant,
                           f"k.{uuid.uuid4().hex[:8]}")
    elif table == "documents":
        await conn.execute("INSERT INTO documents (memory_id, tenant_id, user_id, layer, source, confidence, content,"
                           " terms, created_at) VALUES ($1, $2, 'u', 5, 2, 1, 'c', '{c}', $3)", uuid.uuid4(), tenant,
                           now)
    else:
        await conn.execute("INSERT INTO tombstones (memory_id, tenant_id) VALUES ($1, $2)", uuid.uuid4(), tenant)


@pytest.mark.parametrize("package", sorted(TABLES))
async def test_a_query_without_a_tenant_filter_returns_only_the_callers_rows(
    package: str, database_url: str, schema: str, db: Database
) -> None:
    await apply_migrations(database_url, schema, load_migrations(package))
    store, outbox = EventStore(db), Outbox(db)
    for seed in range(15):  # a random mix of tenants, rows and requests per round
        rng = random.Random(seed)
        tenants = [f"t{seed}-{rng.randrange(10**6)}" for _ in range(rng.randint(2, 5))]
        owned = {(table, t): 0 for table in TABLES[package] for t in tenants}
        for _ in range(rng.randint(10, 30)):
            table, tenant = rng.choice(TABLES[package]), rng.choice(tenants)
            async with db.transaction(tenant) as conn:
                await insert_row(conn, table, tenant, store, outbox)
            owned[table, tenant] += 1
        for _ in range(20):
            table, caller = rng.choice(TABLES[package]), rng.choice(tenants)
            async with db.transaction(caller) as conn:
                seen = [r[0] for r in await conn.fetch(f"SELECT tenant_id FROM {table} WHERE tenant_id LIKE $1",
                                                       f"t{seed}-%")]
            assert seen == [caller] * owned[table, caller], f"seed {seed}: {table} leaked to {caller}"


async def test_no_tenant_stated_means_no_rows_and_writing_for_another_tenant_is_refused(db: Database) -> None:
    store = EventStore(db)
    async with db.transaction("acme") as conn:
        await store.append(conn, "s", 0, [event("acme", "mine")])
    async with db.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM events") == 0
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match="row-level security"):
        async with db.transaction("acme") as conn:
            await store.append(conn, "s2", 0, [event("globex", "smuggled")])
    async with db.system_transaction() as conn:
        assert await conn.fetchval("SELECT count(*) FROM events") == 1
    with pytest.raises(ValueError, match="one tenant id"):
        async with db.transaction("*"):
            pass


async def test_the_services_role_is_bound_by_row_level_security(database_url: str, schema: str) -> None:
    owner = Database(database_url, schema, role=None)  # the owner's own login: a superuser here
    await owner.open()
    try:
        async with owner.connection() as conn:
            superuser = await conn.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
    finally:
        await owner.close()
    app = Database(database_url, schema)
    await app.open()
    try:
        async with app.connection() as conn:
            row = await conn.fetchrow("SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user")
    finally:
        await app.close()
    assert (row["rolsuper"], row["rolbypassrls"]) == (False, False)
    if superuser:  # a pool acting as a role that reads through the policies is refused outright
        refused = Database(database_url, schema, role=None, app_url=database_url)
        refused.role = "postgres"
        with pytest.raises(RoleError, match="bypasses row-level security"):
            await refused.open()
        await refused.close()


@pytest.mark.parametrize("package", ["services.memory_writer", "services.retriever", "services.tool_gateway",
                                     "services.adapter", None])
async def test_every_table_with_a_tenant_column_has_row_level_security_enabled_and_forced(
    package: str | None, database_url: str, schema: str
) -> None:
    """A guard for tables yet to come: a tenant_id column without a forced policy fails here."""
    if package:
        await apply_migrations(database_url, schema, load_migrations(package))
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity,"
            "       EXISTS (SELECT 1 FROM pg_policy p WHERE p.polrelid = c.oid) AS has_policy"
            " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'tenant_id' AND NOT a.attisdropped"
            " WHERE n.nspname = $1 AND c.relkind = 'r'", schema)
    finally:
        await conn.close()
    assert rows, "no tenant-owned table found: the query is wrong"
    unprotected = [r["relname"] for r in rows if not (r["relrowsecurity"] and r["relforcerowsecurity"]
                                                      and r["has_policy"])]
    assert unprotected == []
