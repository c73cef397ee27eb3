"""The PostgreSQL connection pool of one service, pinned to that service's schema."""

from __future__ import annotations

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

__all__ = ["Database"]


class Database:
    """A pool whose connections see `schema` first on their search path."""

    def __init__(self, url: str, schema: str, *, min_size: int = 1, max_size: int = 10) -> None:
        self.url, self.schema = url, schema
        self.pool = AsyncConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            open=False,
            kwargs={"options": f"-c search_path={schema},public"},
        )

    async def open(self) -> None:
        await self.pool.open(wait=True, timeout=15)

    async def close(self) -> None:
        await self.pool.close()

    def connection(self):  # -> AsyncContextManager[AsyncConnection]
        """A pooled connection; `async with db.connection() as conn, conn.transaction(): ...`."""
        return self.pool.connection()

    async def listen_connection(self) -> AsyncConnection:
        """A dedicated autocommit connection for LISTEN (not from the pool)."""
        return await AsyncConnection.connect(self.url, autocommit=True,
                                             options=f"-c search_path={self.schema},public")
