"""Session compression: triggers, an extractive summary that keeps key facts, traceable to its turns;
measured on a set of sessions (compression ratio, share of key facts kept)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from fakes import FakeUnitOfWork, MemoryDatabase

from libs.errors import Unavailable, ValidationFailed
from services.memory_writer.adapters.llm import OpenAICompatibleSummarizer
from services.memory_writer.domain import Layer, SessionCompressed, Source, WriteMemory
from services.memory_writer.domain.compression import Triggers, Turn, should_compress
from services.memory_writer.service_layer.compression import CompressSession, compress_session
from services.memory_writer.service_layer.handlers import SetTenantPolicy, set_tenant_policy, write_memory

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
SESSIONS = json.loads((Path(__file__).parent.parent / "data" / "compression_sessions.json").read_text("utf-8"))


async def record_session(db: MemoryDatabase, turns: list[list[str]], session: str = "s1") -> list[str]:
    ids = []
    for i, (role, text) in enumerate(turns):
        write = WriteMemory(tenant_id="acme", user_id="u1", session_id=session, layer=Layer.SESSION,
                            source=Source.USER_STATEMENT, content=text, tags=(f"role:{role}",))
        ids.append((await write_memory(write, FakeUnitOfWork(db), now=NOW + timedelta(seconds=i))).memory_id)
    return ids


def test_the_turn_trigger_and_the_token_share_trigger() -> None:
    turns = [Turn(str(i), "user", "short") for i in range(10)]
    assert should_compress(turns, Triggers()) == "turns"
    assert should_compress(turns[:9], Triggers()) == ""
    long = [Turn("1", "user", "词" * 700)]
    assert should_compress(long, Triggers(window_tokens=1000)) == "tokens"


async def test_the_summary_covers_its_turns_and_is_traceable_and_a_second_run_has_nothing_to_do() -> None:
    db = MemoryDatabase()
    ids = await record_session(db, SESSIONS[0]["turns"])
    done = await compress_session(CompressSession("acme", "u1", "s1"), FakeUnitOfWork(db), now=NOW)
    assert done.trigger == "turns" and list(done.covered) == ids
    summary = db.rows[done.summary_memory_id]
    assert summary.derived_from == tuple(ids) and "summary" in summary.tags and summary.layer is Layer.SHORT_TERM
    assert any(isinstance(e, SessionCompressed) for _, e in db.published)
    again = await compress_session(CompressSession("acme", "u1", "s1", force=True), FakeUnitOfWork(db), now=NOW)
    assert again.trigger == "" and not again.summary_memory_id


def test_extractive_compression_keeps_the_key_facts_of_the_set_at_a_real_compression_ratio() -> None:
    from services.memory_writer.domain.compression import estimate_tokens, extractive_summary

    kept = total = 0
    before = after = 0
    for session in SESSIONS:
        turns = [Turn(str(i), role, text) for i, (role, text) in enumerate(session["turns"])]
        summary = extractive_summary(turns)
        before += sum(estimate_tokens(t.text) for t in turns)
        after += estimate_tokens(summary)
        kept += sum(fact in summary for fact in session["facts"])
        total += len(session["facts"])
    ratio, share = after / before, kept / total
    print(f"extractive compression on {len(SESSIONS)} sessions: ratio {ratio:.2f} (summary/original tokens), "
          f"key facts kept {kept}/{total} = {share:.2f}")
    assert ratio <= 0.7 and share >= 0.9


async def test_abstractive_needs_an_llm_and_uses_it_when_configured() -> None:
    db = MemoryDatabase()
    ids = await record_session(db, SESSIONS[3]["turns"])
    with pytest.raises(Unavailable):
        await compress_session(CompressSession("acme", "u1", "s1", strategy="abstractive"), FakeUnitOfWork(db))
    seen = []

    def reply(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"message": {"content": "上海，3月20日，两间无烟房，800元"}}]})

    llm = OpenAICompatibleSummarizer("http://llm.test/v1", "m", transport=httpx.MockTransport(reply))
    done = await compress_session(CompressSession("acme", "u1", "s1", strategy="hybrid"), FakeUnitOfWork(db), llm,
                                  now=NOW)
    await llm.close()
    assert db.rows[done.summary_memory_id].content == "上海，3月20日，两间无烟房，800元"
    assert seen[0]["model"] == "m" and "3月20日" in seen[0]["messages"][1]["content"]
    assert db.rows[done.summary_memory_id].derived_from == tuple(ids)


async def test_an_unknown_strategy_is_refused_naming_it() -> None:
    with pytest.raises(ValidationFailed) as err:
        await compress_session(replace(CompressSession("acme", "u1", "s1"), strategy="magic"),
                               FakeUnitOfWork(MemoryDatabase()))
    assert err.value.field == "strategy"


async def test_a_summary_follows_the_tenants_contacts_rule_set_after_its_turns() -> None:
    db = MemoryDatabase()
    await record_session(db, [["user", "my number is 138 1234 5678"], ["assistant", "noted"]])
    await set_tenant_policy(SetTenantPolicy("acme", True, "admin"), FakeUnitOfWork(db))
    done = await compress_session(CompressSession("acme", "u1", "s1", force=True), FakeUnitOfWork(db), now=NOW)
    summary = db.rows[done.summary_memory_id]
    assert summary.sensitive_kind == "phone" and "13812345678" not in summary.redacted.replace(" ", "")


def test_an_extractive_summary_of_both_speakers_is_not_taken_for_a_fake_transcript() -> None:
    """The summary goes through the poisoning guard like any write: its lines name their speaker, but not as the
    "user:" / "assistant:" lines of a chat transcript the guard holds."""
    from services.memory_writer.domain.compression import Turn, extractive_summary
    from services.memory_writer.domain.guard import findings

    turns = [Turn("m1", "user", "I prefer aisle seats on long flights, budget 3000 yuan."),
             Turn("m2", "assistant", "Noted: aisle seats, at most 3000 yuan."),
             Turn("m3", "user", "我下周三要去上海出差，订两间无烟房。")]
    summary = extractive_summary(turns, budget_ratio=1.0)
    assert "aisle" in summary and "上海" in summary and findings(summary) == ()
