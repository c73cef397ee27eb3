"""The application role: what the services act as, so that row-level security binds them.

Migrations run as the owner of the schemas (the login of DATABASE_URL). The services act as
``APP_ROLE``: no superuser, no BYPASSRLS, not an owner, granted only data access to the
service schemas. A superuser or a table owner would read through every policy, so the pool
checks at connect time that it really is bound by them.
"""

from __future__ import annotations

import asyncpg

from libs.logs import get_logger

__all__ = ["APP_ROLE", "RoleError", "check_bound_by_rls", "grant_app_role"]

log = get_logger(__name__)
APP_ROLE = "mnemesh_app"


class RoleError(Exception):
    pass


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def grant_app_role(conn: asyncpg.Connection, schema: str, role: str = APP_ROLE) -> None:
    """As the owner: make sure `role` exists and may use `schema`'s tables, and nothing more."""
    async with conn.transaction():
        # Roles are cluster-wide: replicas of several services may get here at once.
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('mnemesh:roles'))")
        exists = await conn.fetchval("SELECT true FROM pg_roles WHERE rolname = $1", role)
        if not exists:
            await conn.execute(f"CREATE ROLE {_ident(role)} NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE")
            log.info("application role created", role=role)
        superuser = await conn.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        if not superuser:
            # The owner takes the role at connect time (SET ROLE); a superuser needs no membership.
            try:
                await conn.execute(f"GRANT {_ident(role)} TO current_user")
            except asyncpg.InsufficientPrivilegeError:
                log.info("could not grant the application role to the owner; the services must log in as it "
                         "(DATABASE_APP_URL)", role=role)
        s, r = _ident(schema), _ident(role)
        await conn.execute(f"GRANT USAGE ON SCHEMA {s} TO {r}")
        await conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {r}")
        await conn.execute(f"REVOKE ALL ON {s}.schema_migrations FROM {r}")
        await conn.execute(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {s} TO {r}")


async def check_bound_by_rls(conn: asyncpg.Connection) -> None:
    """Refuse a connection that would read through row-level security."""
    row = await conn.fetchrow("SELECT current_user AS name, rolsuper, rolbypassrls FROM pg_roles"
                              " WHERE rolname = current_user")
    if row["rolsuper"] or row["rolbypassrls"]:
        raise RoleError(
            f"the services act as PostgreSQL role {row['name']!r}, which bypasses row-level security; "
            f"let them act as {APP_ROLE!r} (the default) or set DATABASE_APP_URL to a login without "
            "SUPERUSER and BYPASSRLS")
