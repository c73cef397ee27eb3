"""The key ring: tenant keys and user data keys in PostgreSQL, wrapped up to the master key.

Tenant keys (and each tenant's search key, for keyed hashes) are unwrapped through the key
provider and kept in this process, by version; user data keys are unwrapped per unit of work and
never cached beyond it, so a shredded user key is gone from every replica as soon as its row is.
Forgetting a tenant destroys its user keys and empties its tenant key versions (the rows stay), so a
key made for the tenant afterwards has a version no replica has cached.

Keys in use: a unit of work that is about to use a tenant's keys takes, without waiting, a shared
advisory lock on them (`hold`: the tenant's, and each user's it seals for); destroying keys takes the
lock exclusively first, waiting for the units in flight. So a forget waits for the writes that hold the
keys it destroys (and then deletes what they wrote), a write that comes while a forget waits or runs
tries again for a moment, then is refused as Busy (retried later, it starts afresh, under a new key),
and nothing is ever sealed under a destroyed key. A unit never waits for a keys lock while holding others, so these locks cannot
deadlock, and a waiting forget is never starved (a shared request yields to a waiting exclusive one).
"""

from __future__ import annotations

import hashlib
import hmac

import asyncpg

from libs.crypto import CryptoError, KeyProvider, new_key, open_sealed, seal
from libs.db import rowcount

__all__ = ["KeyRing", "KeyShredded", "keyed", "keys_lock"]


def keyed(search_key: bytes, value: str) -> str:
    """HMAC-SHA256 of `value` under a tenant's search key."""
    return hmac.new(search_key, value.encode(), hashlib.sha256).hexdigest()


# A tenant's user keys under a live tenant key version (a destroyed version's are not keys any more).
_LIVE_KEYS = ("SELECT u.user_id, u.wrapped, u.tenant_version FROM user_keys u JOIN tenant_keys t"
              " ON t.tenant_id = u.tenant_id AND t.version = u.tenant_version"
              " WHERE u.tenant_id = $1 AND t.wrapped IS NOT NULL")
_TRY_SHARED = ("SELECT coalesce(bool_and(pg_try_advisory_xact_lock_shared(hashtext(k))), true)"
               " FROM (SELECT k FROM unnest($1::text[]) AS k ORDER BY k) s")
# The same as a unit's first statement, which also states its tenant (libs.db.act_as): one round trip.
_ACT_AND_HOLD = f"SELECT set_config('mnemesh.tenant_id', $2, true), ({_TRY_SHARED})"


def keys_lock(tenant_id: str, user_id: str = "") -> str:
    """The advisory lock on a tenant's keys (`user_id`: on that user's data key)."""
    return f"keys-in-use:{tenant_id}:{user_id}" if user_id else f"keys-in-use:{tenant_id}"


class KeyShredded(CryptoError):
    """The user's data key was destroyed (the user was forgotten): their sealed content is unreadable."""


class KeyRing:
    def __init__(self, provider: KeyProvider) -> None:
        self.provider = provider
        self._tenant: dict[tuple[str, int], tuple[bytes, bytes]] = {}  # (tenant, version) -> (key, search key)

    @staticmethod
    def _tenant_ctx(tenant_id: str, version: int, what: str) -> bytes:
        return f"mnemesh/{what}/{tenant_id}/{version}".encode()

    @staticmethod
    def _user_ctx(tenant_id: str, user_id: str) -> bytes:
        return f"mnemesh/user/{tenant_id}/{user_id}".encode()

    async def _load(self, conn: asyncpg.Connection, tenant_id: str, version: int | None) -> tuple[int, bytes, bytes]:
        if version is not None and (tenant_id, version) in self._tenant:  # a version never changes
            return (version, *self._tenant[(tenant_id, version)])
        query = "SELECT version, wrapped, search_wrapped FROM tenant_keys WHERE tenant_id = $1"
        row = await (conn.fetchrow(query + " AND version = $2", tenant_id, version) if version is not None else
                     conn.fetchrow(query + " ORDER BY version DESC LIMIT 1", tenant_id))
        if row is None or row["wrapped"] is None:
            if version is not None:
                if row is not None:
                    raise KeyShredded(f"tenant key version {version} of {tenant_id} was destroyed (tenant forgotten)")
                raise CryptoError(f"tenant key version {version} of {tenant_id} is missing")
            # None yet, or all destroyed: a new key, under a version never used before.
            for cached in [k for k in self._tenant if k[0] == tenant_id]:  # destroyed ones, if any
                del self._tenant[cached]
            version = row["version"] + 1 if row is not None else 1
            key, search = new_key(), new_key()
            await conn.execute(
                "INSERT INTO tenant_keys (tenant_id, version, wrapped, search_wrapped, master_key_id)"
                " VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING", tenant_id, version,
                self.provider.wrap(key, self._tenant_ctx(tenant_id, version, "tenant")),
                self.provider.wrap(search, self._tenant_ctx(tenant_id, version, "search")), self.provider.key_id)
            return await self._load(conn, tenant_id, None)
        v = row["version"]
        if (tenant_id, v) not in self._tenant:
            self._tenant[(tenant_id, v)] = (
                self.provider.unwrap(row["wrapped"], self._tenant_ctx(tenant_id, v, "tenant")),
                self.provider.unwrap(row["search_wrapped"], self._tenant_ctx(tenant_id, v, "search")))
        return (v, *self._tenant[(tenant_id, v)])

    async def keyed_hash(self, conn: asyncpg.Connection, tenant_id: str, value: str) -> str:
        """HMAC-SHA256 of `value` under the tenant's search key: equal values, equal hashes; nothing else."""
        return keyed(await self.search_key(conn, tenant_id), value)

    async def search_key(self, conn: asyncpg.Connection, tenant_id: str) -> bytes:
        """The tenant's search key (the same across tenant key versions), for `keyed`."""
        _, _, search = await self._load(conn, tenant_id, None)
        return search

    async def user_keys(self, conn: asyncpg.Connection, tenant_id: str, user_ids: list[str]) -> dict[str, bytes]:
        """The data keys of `user_ids`, created for those who have none, in at most three statements."""
        found = await self._user_keys_of(conn, tenant_id, user_ids)
        missing = sorted(set(user_ids) - set(found))
        if missing:
            version, tenant_key, _ = await self._load(conn, tenant_id, None)
            await conn.execute(
                "INSERT INTO user_keys (tenant_id, user_id, wrapped, tenant_version)"
                " SELECT $1, u, w, $4 FROM unnest($2::text[], $3::bytea[]) AS k(u, w) ON CONFLICT DO NOTHING",
                tenant_id, missing, [seal(tenant_key, new_key(), self._user_ctx(tenant_id, u)) for u in missing],
                version)
            found.update(await self._user_keys_of(conn, tenant_id, missing))  # a concurrent writer's, if it won
        return found

    async def _user_keys_of(self, conn: asyncpg.Connection, tenant_id: str, user_ids: list[str]) -> dict[str, bytes]:
        rows = await conn.fetch(_LIVE_KEYS + " AND u.user_id = ANY($2::text[])", tenant_id, user_ids)
        keys = {}
        for row in rows:
            _, tenant_key, _ = await self._load(conn, tenant_id, row["tenant_version"])
            keys[row["user_id"]] = open_sealed(tenant_key, row["wrapped"], self._user_ctx(tenant_id, row["user_id"]))
        return keys

    async def user_key(self, conn: asyncpg.Connection, tenant_id: str, user_id: str, *, create: bool) -> bytes:
        row = await conn.fetchrow(_LIVE_KEYS + " AND u.user_id = $2", tenant_id, user_id)
        if row is not None:
            _, tenant_key, _ = await self._load(conn, tenant_id, row["tenant_version"])
            return open_sealed(tenant_key, row["wrapped"], self._user_ctx(tenant_id, user_id))
        if not create:
            raise KeyShredded(f"user {user_id} of {tenant_id} has no data key (forgotten)")
        version, tenant_key, _ = await self._load(conn, tenant_id, None)
        key = new_key()
        inserted = await conn.execute(
            "INSERT INTO user_keys (tenant_id, user_id, wrapped, tenant_version) VALUES ($1, $2, $3, $4)"
            " ON CONFLICT DO NOTHING", tenant_id, user_id, seal(tenant_key, key, self._user_ctx(tenant_id, user_id)),
            version)
        if inserted.endswith(" 0"):  # a concurrent writer created it first: use theirs
            return await self.user_key(conn, tenant_id, user_id, create=False)
        return key

    @staticmethod
    async def hold(conn: asyncpg.Connection, locks: list[str], *, acting_as: str = "") -> bool:
        """Take these keys locks (keys_lock) shared for the rest of the transaction, without waiting; False when
        one is taken or awaited exclusively (its keys are being destroyed). `acting_as`: also state the
        transaction's tenant, in the same statement."""
        if acting_as:
            return (await conn.fetchrow(_ACT_AND_HOLD, locks, acting_as))[1]
        return await conn.fetchval(_TRY_SHARED, locks)

    async def shred(self, conn: asyncpg.Connection, tenant_id: str, user_id: str) -> bool:
        """Destroy the user's data key: everything sealed under it can never be opened again. Waits first for
        the units using it (see the module's note on keys in use)."""
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", keys_lock(tenant_id, user_id))
        status = await conn.execute("DELETE FROM user_keys WHERE tenant_id = $1 AND user_id = $2", tenant_id, user_id)
        return not status.endswith(" 0")

    async def shred_tenant(self, conn: asyncpg.Connection, tenant_id: str) -> int:
        """Destroy every key of the tenant: its users' data keys, its tenant keys and its search key. Every
        sealed copy and keyed hash made under them can never be opened or matched again. How many user keys."""
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1)), pg_advisory_xact_lock(hashtext($2))",
                           keys_lock(tenant_id), f"tenant-key:{tenant_id}")  # waits for the units using them
        await conn.execute("UPDATE tenant_keys SET wrapped = NULL, search_wrapped = NULL, destroyed_at = now()"
                           " WHERE tenant_id = $1 AND wrapped IS NOT NULL", tenant_id)
        status = await conn.execute("DELETE FROM user_keys WHERE tenant_id = $1", tenant_id)
        for cached in [k for k in self._tenant if k[0] == tenant_id]:
            del self._tenant[cached]
        return rowcount(status)

    async def rotate_tenant(self, conn: asyncpg.Connection, tenant_id: str) -> tuple[int, int]:
        """A new tenant key version; every user key is re-wrapped under it (content is not re-encrypted).

        The search key is carried over (re-wrapped), so keyed hashes stay comparable. Returns the new
        version and the number of user keys re-wrapped. Old versions are kept until none is used.
        """
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"tenant-key:{tenant_id}")
        old_version, _, search = await self._load(conn, tenant_id, None)
        version, key = old_version + 1, new_key()
        await conn.execute(
            "INSERT INTO tenant_keys (tenant_id, version, wrapped, search_wrapped, master_key_id)"
            " VALUES ($1, $2, $3, $4, $5)", tenant_id, version,
            self.provider.wrap(key, self._tenant_ctx(tenant_id, version, "tenant")),
            self.provider.wrap(search, self._tenant_ctx(tenant_id, version, "search")), self.provider.key_id)
        rewrapped = 0
        for row in await conn.fetch("SELECT user_id FROM user_keys WHERE tenant_id = $1 FOR UPDATE", tenant_id):
            user_key = await self.user_key(conn, tenant_id, row["user_id"], create=False)
            await conn.execute("UPDATE user_keys SET wrapped = $3, tenant_version = $4 WHERE tenant_id = $1"
                               " AND user_id = $2", tenant_id, row["user_id"],
                               seal(key, user_key, self._user_ctx(tenant_id, row["user_id"])), version)
            rewrapped += 1
        self._tenant[(tenant_id, version)] = (key, search)
        return version, rewrapped
