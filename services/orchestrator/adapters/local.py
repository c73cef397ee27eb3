"""In-process stand-ins for the tool-gateway and memory: the local fixture the benchmark's tools answer
from, the default when no gateway or retriever address is configured, and what tests script.

`LocalTools` behaves like the gateway port: a deadline turns into a timeout, an exception into a
structured failure, and cancelling the awaiting task cancels the handler (recorded in `cancelled`,
as the upstream would see it).
"""

from __future__ import annotations

import asyncio
import json
import uuid
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from libs.text import tokenize
from services.orchestrator.service_layer.ports import CallStatus, MemoryHit, ToolInfo, ToolResult

__all__ = ["LocalMemory", "LocalTools", "ToolFailure", "sample_tools"]

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class ToolFailure(Exception):
    """A tool's own failure (its backend answered with an error); `retryable` as the gateway's error says."""

    def __init__(self, reason: str, retryable: bool = True) -> None:
        super().__init__(reason)
        self.retryable = retryable


async def _order_status(args: dict[str, Any]) -> dict[str, Any]:
    order_id = str(args.get("order_id", ""))
    day = 1 + zlib.crc32(order_id.encode()) % 28
    return {"order_id": order_id, "status": "shipped", "eta": f"2026-03-{day:02d}"}


async def _invoice(args: dict[str, Any]) -> dict[str, Any]:
    order_id = str(args.get("order_id", ""))
    cents = 1_000 + zlib.crc32(order_id.encode()) % 90_000
    return {"order_id": order_id, "amount": f"{cents // 100}.{cents % 100:02d}", "currency": "EUR", "status": "paid"}


def sample_tools() -> dict[str, Handler]:
    return {"orders.get_status": _order_status, "billing.get_invoice": _invoice}


@dataclass
class LocalTools:
    handlers: dict[str, Handler] = field(default_factory=sample_tools)
    statuses: dict[str, CallStatus] = field(default_factory=dict)  # what status() answers per call id
    default_status: CallStatus = field(default_factory=lambda: CallStatus("unknown"))
    status_checks: list[str] = field(default_factory=list)
    calls: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)

    async def call(self, tenant_id: str, user_id: str, session_id: str, tool: str, arguments: dict[str, Any],
                   call_id: str, deadline_seconds: float) -> ToolResult:
        self.calls.append((tool, arguments, call_id))
        handler = self.handlers.get(tool)
        if handler is None:
            return ToolResult(False, reason=f"unknown tool {tool!r}", retryable=False)
        self.started.set()
        try:
            async with asyncio.timeout(deadline_seconds):
                return ToolResult(True, await handler(arguments))
        except TimeoutError:
            return ToolResult(False, reason=f"no answer within {deadline_seconds} s", timed_out=True)
        except ToolFailure as exc:
            return ToolResult(False, reason=str(exc), retryable=exc.retryable)
        except asyncio.CancelledError:
            self.cancelled.append(call_id)
            raise

    async def status(self, tenant_id: str, call_id: str) -> CallStatus:
        self.status_checks.append(call_id)
        return self.statuses.get(call_id, self.default_status)

    async def list_tools(self, tenant_id: str) -> list[ToolInfo]:
        return [ToolInfo(name, f"local fixture tool {name}", {"type": "object"}) for name in sorted(self.handlers)]


@dataclass
class LocalMemory:
    """Memories held in process: keyword-overlap search, step results kept by step id."""

    memories: list[tuple[MemoryHit, str]] = field(default_factory=list)  # (hit, user id)
    steps: dict[str, dict[str, str]] = field(default_factory=dict)
    turns: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)  # session -> (role, text, key)
    compressed: list[str] = field(default_factory=list)  # sessions whose compression was asked for
    outcomes: dict[str, dict] = field(default_factory=dict)  # memory id -> recorded outcome (agent to agent)
    confirmed: list[str] = field(default_factory=list)  # memory ids the user confirmed (L2 -> L1)

    def remember(self, user_id: str, memory_id: str, content: str, key: str = "", *, strong: bool = True,
                 must_confirm: bool = False) -> None:
        self.memories.append((MemoryHit(memory_id, content, key, 0.0, must_confirm, strong), user_id))

    async def search(self, tenant_id: str, user_id: str, session_id: str, query: str,
                     limit: int = 5) -> list[MemoryHit]:
        terms = set(tokenize(query))
        scored = []
        for hit, owner in self.memories:
            if owner != user_id:
                continue
            words = set(tokenize(hit.content)) | set(tokenize(hit.key))
            score = len(terms & words) / max(1, len(terms))
            if score > 0 or hit.key == query:
                scored.append(MemoryHit(hit.memory_id, hit.content, hit.key, max(score, 1.0 if hit.key == query else 0),
                                        hit.must_confirm, hit.strong))
        return sorted(scored, key=lambda h: -h.score)[:limit]

    async def write_step(self, tenant_id: str, user_id: str, session_id: str, step_id: str, tool: str,
                         content: str, trigger: str) -> None:
        self.steps[step_id] = {"tool": tool, "content": content, "trigger": trigger, "session_id": session_id}
        json.loads(content)  # step results are JSON; anything else is a bug upstream

    async def write_turns(self, tenant_id: str, user_id: str, session_id: str,
                          turns: list[tuple[str, str, str]]) -> None:
        kept = self.turns.setdefault(session_id, [])
        kept += [t for t in turns if t[2] not in {k for _, _, k in kept}]  # idempotent by key

    async def compress(self, tenant_id: str, user_id: str, session_id: str, window_tokens: int) -> str:
        """Summarise the session's turns into one memory of the user (the turns themselves, in order) once
        they fill 65 % of the window (words standing in for tokens), as the memory-writer's trigger does."""
        turns = self.turns.get(session_id, [])
        if sum(len(text.split()) for _, text, _ in turns) < 0.65 * window_tokens:
            return ""
        del self.turns[session_id]
        self.compressed.append(session_id)
        memory_id = f"summary-{session_id}-{len(self.compressed)}"
        self.remember(user_id, memory_id, "\n".join(f"{role}: {text}" for role, text, _ in turns), strong=False,
                      must_confirm=True)
        return memory_id

    async def confirm(self, tenant_id: str, user_id: str, memory_id: str, reason: str) -> None:
        for i, (hit, owner) in enumerate(self.memories):
            if hit.memory_id == memory_id and owner == user_id:
                self.memories[i] = (MemoryHit(hit.memory_id, hit.content, hit.key, hit.score, False, True), owner)
                self.confirmed.append(memory_id)
                return
        raise ValueError(f"memory {memory_id} of {user_id} not found")

    async def record_outcome(self, tenant_id: str, user_id: str, session_id: str, content: str, *,
                             tags: tuple[str, ...], derived_from: tuple[str, ...], idempotency_key: str) -> str:
        memory_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{tenant_id}/{user_id}/{idempotency_key}"))
        self.outcomes[memory_id] = {"content": content, "tags": tags, "derived_from": derived_from,
                                    "session_id": session_id, "user_id": user_id}
        self.remember(user_id, memory_id, content)
        return memory_id
