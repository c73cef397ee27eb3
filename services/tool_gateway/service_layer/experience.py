"""Procedural memory through the service layer: fold a call into experience, read it back."""

from __future__ import annotations

from services.tool_gateway.domain.experience import Experience, Observation, context_key, observe
from services.tool_gateway.service_layer.ports import ExperienceStore

__all__ = ["experience_notes", "record_call", "record_calls", "tool_stats"]


async def record_call(tenant_id: str, tool: str, context: str, obs: Observation, store: ExperienceStore) -> None:
    """Count the call for the tool overall and, when the caller declared a task kind, for that context."""
    for key in ("", context_key(context)) if context else ("",):
        exp = await store.load(tenant_id, tool, key) or Experience(tool, key)
        if observe(exp, obs):
            await store.save(tenant_id, exp)


async def record_calls(tenant_id: str, calls: list[tuple[str, str, Observation]], store: ExperienceStore) -> None:
    """`record_call` for many calls of one tenant: each (tool, context) row is read and written once."""
    folded: dict[tuple[str, str], Experience] = {}
    changed: set[tuple[str, str]] = set()
    for tool, context, obs in calls:
        for key in ("", context_key(context)) if context else ("",):
            exp = folded.get((tool, key))
            if exp is None:
                exp = folded[tool, key] = await store.load(tenant_id, tool, key) or Experience(tool, key)
            if observe(exp, obs):
                changed.add((tool, key))
    for pair in sorted(changed):  # a fixed order: two replicas' batches lock the rows alike, no deadlock
        await store.save(tenant_id, folded[pair])


async def tool_stats(tenant_id: str, store: ExperienceStore, name: str = "", context: str = "") -> list[Experience]:
    return await store.find(tenant_id, [name] if name else [], context_key(context))


async def experience_notes(tenant_id: str, names: list[str], store: ExperienceStore) -> dict[str, Experience]:
    """The overall experience of each named tool that has one (what tools/list appends)."""
    return {exp.tool: exp for exp in await store.find(tenant_id, names, "")}
