"""The PostgreSQL connection pool of one service (asyncpg), pinned to its schema and tenant-scoped.

Every tenant-owned table has row-level security on ``mnemesh.tenant_id``; the pool's
connections act as the application role, which does not bypass it (see roles.py).
A unit of work states whose data it touches:

    async with db.transaction(tenant_id) as conn:      # one tenant, from the caller's token
    async with db.system_transaction() as conn:        # every tenant: relays, global feeds, upkeep

A query that forgets its ``tenant_id`` filter still sees only that tenant's rows, and
a connection that states nothing sees no tenant's rows at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import asyncpg

from libs.db.roles import APP_ROLE, check_bound_by_rls
from libs.logs import get_logger

__all__ = ["ALL_TENANTS", "Database", "act_as", "rowcount"]

log = get_logger(__name__)

# The value of mnemesh.tenant_id that the policies read as "every tenant". No tenant can be
# named this way: tenant ids are validated ([A-Za-z0-9._-]) before they reach the database.
ALL_TENANTS = "*"
_SET_TENANT = "SELECT set_config('mnemesh.tenant_id', $1, true)"


async def act_as(conn: asyncpg.Connection, tenant_id: str) -> None:
    """For the rest of `conn`'s transaction, see and write `tenant_id`'s rows (ALL_TENANTS: every tenant's)."""
    await conn.execute(_SET_TENANT, tenant_id)


def rowcount(status: str) -> int:
    """The row count of a command status such as 'INSERT 0 3' or 'DELETE 2'."""
    last = status.rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() else 0


async def _init_connection(conn: asyncpg.Connection) -> None:
    # jsonb in binary: a version byte, then the JSON text. Python values in and out.
    await conn.set_type_codec("jsonb", schema="pg_catalog", format="binary",
                              encoder=lambda v: b"\x01" + json.dumps(v).encode(),
                              decoder=lambda b: json.loads(b[1:]))
    await conn.set_type_codec("json", schema="pg_catalog", encoder=json.dumps, decoder=json.loads)


class Database:
    """A pool whose connections see `schema` first on their search path and act as `role`.

    `role` is the application role (no superuser, no BYPASSRLS). With `app_url`, the pool logs
    in with those credentials (production: a separate login for the services); otherwise it
    logs in with `url` and takes the role at connection start (development: one login).
    """

    def __init__(self, url: str, schema: str, *, min_size: int = 1, max_size: int = 10,
                 role: str | None = APP_ROLE, app_url: str | None = None) -> None:
        self.url, self.schema, self.role, self.app_url = url, schema, role, app_url
        self.min_size, self.max_size = min_size, max_size
        self.pool: asyncpg.Pool | None = None

    def _server_settings(self) -> dict[str, str]:
        settings = {"search_path": f"{self.schema},public", "application_name": f"mnemesh:{self.schema}"}
        if self.role and not self.app_url:
            settings["role"] = self.role
        return settings

    async def open(self) -> None:
        self.pool = await asyncpg.create_pool(
            self.app_url or self.url, min_size=self.min_size, max_size=self.max_size, timeout=15,
            server_settings=self._server_settings(), init=_init_connection)
        if self.role:
            async with self.pool.acquire() as conn:
                await check_bound_by_rls(conn)

    async def close(self, timeout: float = 5.0) -> None:
        """Close the pool once its connections are back; after `timeout` s, close them anyway.

        asyncpg waits for every acquired connection without limit, so one task that never let go
        (a bug elsewhere) would otherwise hang the whole shutdown.
        """
        pool, self.pool = self.pool, None
        if pool is None:
            return
        try:
            await asyncio.wait_for(pool.close(), timeout)
        except TimeoutError:
            log.warning("database connections still in use at shutdown; closing them", schema=self.schema,
                        timeout_s=timeout)
            pool.terminate()

    def connection(self):  # -> AsyncContextManager[asyncpg.Connection]
        """A pooled connection with no tenant stated: tenant-owned tables look empty through it."""
        assert self.pool is not None, "open() the database first"
        return self.pool.acquire()

    @contextlib.asynccontextmanager
    async def transaction(self, tenant_id: str) -> AsyncIterator[asyncpg.Connection]:
        """A transaction that sees and writes `tenant_id`'s rows only."""
        if not tenant_id or tenant_id == ALL_TENANTS:
            raise ValueError(f"a unit of work needs one tenant id, not {tenant_id!r}; "
                             "use system_transaction() for work across tenants")
        async with self.connection() as conn, conn.transaction():
            await act_as(conn, tenant_id)
            yield conn

    @contextlib.asynccontextmanager
    async def system_transaction(self) -> AsyncIterator[asyncpg.Connection]:
        """A transaction across every tenant, for the mesh's own machinery (never for a request)."""
        async with self.connection() as conn, conn.transaction():
            await act_as(conn, ALL_TENANTS)
            yield conn

    async def connect(self) -> asyncpg.Connection:
        """A dedicated connection outside the pool (LISTEN, leader locks), acting as the same role."""
        conn = await asyncpg.connect(self.app_url or self.url, timeout=15,
                                     server_settings=self._server_settings())
        await _init_connection(conn)
        return conn
