"""Compress a session's history into one summary memory, through the write pipeline.

The summary is a short-term memory (a model inference, L2: confirm before relying on a detail),
tagged `summary` and `strategy:<name>`, whose `derived_from` lists every turn it covers, so any
detail can be traced back to its turn. Sensitive turns are summarised from their redacted text.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from libs.errors import Unavailable, ValidationFailed
from services.memory_writer.domain import Layer, SessionCompressed, Source, WriteMemory
from services.memory_writer.domain.compression import (
    Triggers,
    Turn,
    estimate_tokens,
    extractive_summary,
    should_compress,
)
from services.memory_writer.domain.policy import DEFAULT_POLICY, WritePolicy
from services.memory_writer.service_layer.unit_of_work import UnitOfWork
from services.memory_writer.service_layer.writes import _Recent, _write_in, tenant_rules

__all__ = ["STRATEGIES", "CompressSession", "Compressed", "Summarizer", "compress_session"]

STRATEGIES = ("extractive", "abstractive", "hybrid")


class Summarizer(Protocol):
    """An LLM that writes an abstractive summary (adapters/llm.py: any OpenAI-compatible endpoint)."""

    async def summarize(self, text: str, max_tokens: int) -> str: ...


@dataclass(frozen=True)
class CompressSession:
    tenant_id: str
    user_id: str
    session_id: str
    strategy: str = "extractive"
    force: bool = False
    triggers: Triggers = Triggers()


@dataclass(frozen=True)
class Compressed:
    trigger: str
    summary_memory_id: str = ""
    covered: tuple[str, ...] = ()
    tokens_before: int = 0
    tokens_after: int = 0


def _role(tags: tuple[str, ...]) -> str:
    return next((t.split(":", 1)[1] for t in tags if t.startswith("role:")), "")


async def compress_session(cmd: CompressSession, uow: UnitOfWork, summarizer: Summarizer | None = None,
                           now: datetime | None = None, policy: WritePolicy = DEFAULT_POLICY) -> Compressed:
    """Summarise the session's uncovered turns when a trigger fires (or `force`); the summary is written as
    any write is, under `policy` and the tenant's own rules."""
    if cmd.strategy not in STRATEGIES:
        raise ValidationFailed(f"is {cmd.strategy!r}", field="strategy", hint=f"use one of {', '.join(STRATEGIES)}")
    if cmd.strategy != "extractive" and summarizer is None:
        raise Unavailable(f"the {cmd.strategy} strategy needs an LLM endpoint, and none is configured",
                          retryable=False, hint="set MNEMESH_LLM_BASE_URL and MNEMESH_LLM_MODEL, or use extractive")
    if not cmd.session_id:
        raise ValidationFailed("is required", field="tenant.session_id", hint="name the session to compress")
    now = now or datetime.now(UTC)
    async with uow:
        await uow.hold_keys(cmd.tenant_id, [cmd.user_id])  # first: a forget of the user waits for the summary
        records = await uow.uncovered_turns(cmd.tenant_id, cmd.user_id, cmd.session_id)
        turns = [Turn(r.memory_id, _role(r.tags), r.redacted if r.sensitive_kind else r.content) for r in records]
        trigger = should_compress(turns, cmd.triggers) or ("forced" if cmd.force and turns else "")
        if not trigger:
            return Compressed("")
        before = sum(estimate_tokens(t.text) for t in turns)
        summary = extractive_summary(turns) if cmd.strategy != "abstractive" else "\n".join(
            f"{t.role}: {t.text}" if t.role else t.text for t in turns)
        if cmd.strategy != "extractive":
            summary = await summarizer.summarize(summary, max(64, before // 3))
        write = WriteMemory(
            tenant_id=cmd.tenant_id, user_id=cmd.user_id, session_id=cmd.session_id, layer=Layer.SHORT_TERM,
            source=Source.MODEL_INFERENCE, content=summary[:16_000] or "(empty)",
            tags=("summary", f"strategy:{cmd.strategy}"), derived_from=tuple(t.memory_id for t in turns[:64]),
            written_by="compression", reason=f"session compressed ({trigger})")
        result = await _write_in(uow, write, now, None, _Recent(uow, now, await tenant_rules(uow, cmd.tenant_id, policy)))
        after = estimate_tokens(summary)
        record = await uow.get(cmd.tenant_id, result.memory_id)
        if record is not None:
            await uow.record(f"memory-{result.memory_id}", -1, SessionCompressed(
                record, tuple(t.memory_id for t in turns[:64]), cmd.strategy, trigger, before, after))
    return Compressed(trigger, result.memory_id, tuple(t.memory_id for t in turns[:64]), before, after)
