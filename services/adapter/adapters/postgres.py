"""Imported WSDLs in PostgreSQL (deployment-wide: no tenant, system transactions)."""

from __future__ import annotations

import base64

from libs.db import Database
from services.adapter.service_layer.ports import StoredBackend

__all__ = ["PostgresBackendStore"]


def _row(row) -> StoredBackend:
    documents = {k: base64.b64decode(v) for k, v in row["documents"].items()}
    return StoredBackend(row["backend_id"], row["location"], row["options"], documents, row["wsdl_hash"],
                         row["revision"], list(row["tools"]))


class PostgresBackendStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def get(self, backend_id: str) -> StoredBackend | None:
        async with self.db.system_transaction() as conn:
            row = await conn.fetchrow("SELECT * FROM soap_backends WHERE backend_id = $1", backend_id)
        return _row(row) if row else None

    async def save(self, backend: StoredBackend) -> None:
        documents = {k: base64.b64encode(v).decode() for k, v in backend.documents.items()}
        async with self.db.system_transaction() as conn:
            await conn.execute(
                "INSERT INTO soap_backends (backend_id, location, options, documents, wsdl_hash, revision, tools)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (backend_id) DO UPDATE SET location = $2,"
                " options = $3, documents = $4, wsdl_hash = $5, revision = $6, tools = $7, imported_at = now()",
                backend.backend_id, backend.location, backend.options, documents, backend.wsdl_hash,
                backend.revision, backend.tools)

    async def delete(self, backend_id: str) -> bool:
        async with self.db.system_transaction() as conn:
            status = await conn.execute("DELETE FROM soap_backends WHERE backend_id = $1", backend_id)
        return status.endswith(" 1")

    async def list(self) -> list[StoredBackend]:
        async with self.db.system_transaction() as conn:
            rows = await conn.fetch("SELECT * FROM soap_backends ORDER BY backend_id")
        return [_row(r) for r in rows]
