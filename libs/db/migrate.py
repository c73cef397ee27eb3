"""Versioned, idempotent SQL migrations, applied at start, one schema per service.

Files are named ``NNNN_name.sql``. 0001-0099 are the shared tables of libs/db/migrations
(event store, outbox, processed events); a service's own start at 0100. Each runs
in its own transaction under an advisory lock, so replicas starting together apply
it once; a migration edited after it was applied is refused.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

import asyncpg

from libs.db.roles import APP_ROLE, grant_app_role
from libs.logs import get_logger

__all__ = ["Migration", "MigrationError", "apply_migrations", "load_migrations"]

log = get_logger(__name__)
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


class MigrationError(Exception):
    pass


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def _read(folder: Traversable) -> list[Migration]:
    found = []
    for entry in folder.iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text()))
    return found


def load_migrations(*packages: str) -> list[Migration]:
    """Shared migrations plus those of `packages` (each a package with a migrations/ folder)."""
    migrations = _read(resources.files("libs.db") / "migrations")
    for package in packages:
        migrations += _read(resources.files(package) / "migrations")
    versions = [m.version for m in migrations]
    if len(versions) != len(set(versions)):
        raise MigrationError(f"duplicate migration versions in {packages}: {sorted(versions)}")
    return sorted(migrations, key=lambda m: m.version)


async def apply_migrations(url: str, schema: str, migrations: list[Migration], *,
                           app_role: str | None = APP_ROLE) -> list[int]:
    """Apply what is missing in `schema` as the owner; return the versions applied now.

    Then grant `app_role` (the role the services act as) access to the schema's tables.
    """
    applied_now: list[int] = []
    conn = await asyncpg.connect(url, timeout=15)
    try:
        ident = '"' + schema.replace('"', '""') + '"'
        lock = f"migrate:{schema}"
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", lock)
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {ident}")
            await conn.execute(
                f"CREATE TABLE IF NOT EXISTS {ident}.schema_migrations (version int PRIMARY KEY, name text NOT NULL,"
                " checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
        for migration in migrations:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", lock)
                await conn.execute(f"SET LOCAL search_path TO {ident}, public")
                checksum = await conn.fetchval("SELECT checksum FROM schema_migrations WHERE version = $1",
                                               migration.version)
                if checksum is not None:
                    if checksum != migration.checksum:
                        raise MigrationError(
                            f"migration {migration.version:04d}_{migration.name} of schema {schema} changed "
                            "after it was applied; add a new migration instead of editing an applied one"
                        )
                    continue
                await conn.execute(migration.sql)
                await conn.execute("INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                                   migration.version, migration.name, migration.checksum)
                applied_now.append(migration.version)
                log.info("migration applied", schema=schema, version=migration.version, name=migration.name)
        if app_role:
            await grant_app_role(conn, schema, app_role)
    finally:
        await conn.close()
    return applied_now
