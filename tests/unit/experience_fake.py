"""An in-memory experience store (the PostgreSQL one is tool_stats, per tenant)."""

from __future__ import annotations

import copy

from services.tool_gateway.domain.experience import Experience

__all__ = ["FakeExperience"]


class FakeExperience:
    def __init__(self) -> None:
        self.rows: dict[tuple[str, str, str], Experience] = {}

    async def load(self, tenant_id: str, tool: str, context: str) -> Experience | None:
        found = self.rows.get((tenant_id, tool, context))
        return copy.deepcopy(found) if found else None

    async def save(self, tenant_id: str, exp: Experience) -> None:
        self.rows[tenant_id, exp.tool, exp.context] = copy.deepcopy(exp)

    async def find(self, tenant_id: str, names: list[str], context: str) -> list[Experience]:
        return [e for (t, n, c), e in sorted(self.rows.items()) if t == tenant_id and c == context
                and (not names or n in names)]
