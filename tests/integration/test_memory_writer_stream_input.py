"""Hostile stream commands to a real memory-writer (Redis, PostgreSQL): entries that once stopped the writer or
kept a secret in their dead letter, and event ids that once dropped or failed commands (the same id in two
tenants, an id in capitals, another spelling). The writer and the helpers are test_memory_writer_batches.py's."""

from __future__ import annotations

import json
import uuid

import anyio
import asyncpg
import pytest
import redis.asyncio
from test_memory_writer_batches import command, rows, the_dead_letter, write, writer  # noqa: F401 - fixtures

from libs.config import Settings
from libs.events.schema import MEMORY_COMMANDS, dead_letter_stream

pytestmark = pytest.mark.integration


def _with_payload(fields: dict, payload: str) -> dict:
    return {**fields, "payload": payload}


def _nested(depth: int) -> str:
    return '{"tenant":{"userId":"u1"},"content":"x","attributes":' + '{"a":' * depth + "1" + "}" * depth + "}"


@pytest.mark.parametrize("poison", ["field name", "surrogate", "deep", "repeated key", "not json", "tags",
                                    "attributes", "another field", "tenant", "echoed", "huge"])
async def test_a_poison_command_is_dead_lettered_without_its_secrets_and_the_writer_goes_on(
    writer: Settings, poison: str  # noqa: F811
) -> None:
    """Entries that once stopped the writer (a field name that is not UTF-8, a lone surrogate beside a secret,
    a payload nested deeper than the JSON parser goes) or kept a secret in the dead letter (a repeated key, a
    payload that is not JSON, a secret in a tag or an attribute): each is dead-lettered with its reason, the
    secret nowhere in it, and the next command is stored."""
    client = redis.asyncio.from_url(writer.redis_url)
    stream = f"{writer.namespace}.{MEMORY_COMMANDS}"
    base = command(writer, write("my password is Hunter2Secret99"))
    payload = json.loads(base["payload"])
    entries = {
        "field name": {**{k.encode(): v.encode() for k, v in base.items()}, b"x\xff": b"1"},
        "surrogate": _with_payload(base, base["payload"].replace('Secret99"', 'Secret99 \\ud800"')),
        "deep": _with_payload(base, _nested(1500)),
        "repeated key": _with_payload(base, base["payload"][:-1] + ',"content":"benign words"}'),
        "not json": _with_payload(base, base["payload"] + " trailing"),
        # (refused for their empty content, with a secret elsewhere)
        "tags": _with_payload(base, json.dumps({**payload, "content": "", "tags": ["password=Hunter2Secret99"]})),
        "attributes": _with_payload(base, json.dumps({**payload, "content": "",
                                                      "attributes": {"note": "password: Hunter2Secret99",
                                                                     "password": "Hunter2Secret99",
                                                                     "secret": {"value": "Hunter2Secret99"}}})),
        "another field": {**{k: v for k, v in base.items() if k != "payload"}, "body": base["payload"]},
        "tenant": _with_payload(base, json.dumps({**payload, "content": "", "tenant": {
            **payload["tenant"], "password": "Hunter2Secret99"}})),
        # a parser's message that quotes the value sent (tags must be a list)
        "echoed": _with_payload(base, json.dumps({**payload, "tags": "password=Hunter2Secret99"})),
        # over the size a dead letter checks, with text the e-mail pattern once took minutes on
        "huge": _with_payload(base, json.dumps({**payload, "content": "a." * 100_000 + " password Hunter2Secret99"})),
    }
    try:
        await client.xadd(stream, entries[poison])
        await client.xadd(stream, command(writer, write("stored after the poison", idempotency_key="after")))
        with anyio.fail_after(30):
            while not await rows(writer, "SELECT 1 FROM memories WHERE idempotency_key = 'after'"):
                await anyio.sleep(0.05)
        dead = await the_dead_letter(client, stream)
    finally:
        await client.aclose()
    reason = json.loads(dead[b"dead.reason"])
    assert reason["reason"] and not reason["retryable"], reason
    assert not any(b"Hunter2Secret99" in value for value in dead.values()), dead
    assert len(await rows(writer, "SELECT 1 FROM memories")) == 1


async def test_one_event_id_in_two_tenants_is_two_commands_and_a_mark_from_before_tenants_still_counts(
    writer: Settings  # noqa: F811
) -> None:
    """Producers choose event ids: another tenant's command with the same id (a uuid5 of one business key, say)
    is its own command, not a redelivery; an id marked before marks were per tenant is done for every tenant; an
    id in capitals is the same id; one in another spelling (a URN) is refused alone."""
    client = redis.asyncio.from_url(writer.redis_url)
    stream = f"{writer.namespace}.{MEMORY_COMMANDS}"
    acme = command(writer, write("acme fact", idempotency_key="a1"))
    globex = {**command(writer, write("globex fact", idempotency_key="g1"), tenant="globex"),
              "event_id": acme["event_id"]}
    legacy = command(writer, write("marked before the upgrade", idempotency_key="old"))
    upper = command(writer, write("an event id in capitals", idempotency_key="upper"))
    upper["event_id"] = upper["event_id"].upper()
    urn = command(writer, write("an event id as a URN", idempotency_key="urn"))
    urn["event_id"] = f"urn:uuid:{urn['event_id']}"
    conn = await asyncpg.connect(writer.database_url, server_settings={"search_path": f"{writer.namespace}_memory_writer"})
    try:
        await conn.execute("INSERT INTO processed_events (consumer, event_id) VALUES ('memory-writer', $1)",
                           uuid.UUID(legacy["event_id"]))
        for fields in (acme, globex, legacy, upper, urn):
            await client.xadd(stream, fields)
        with anyio.fail_after(30):
            while (await client.xpending(stream, "memory-writer"))["pending"] or \
                    await client.xlen(stream) or len(await rows(writer, "SELECT 1 FROM memories")) < 3:
                await anyio.sleep(0.05)
        (_, dead), = await client.xrange(dead_letter_stream(stream))
    finally:
        await conn.close()
        await client.aclose()
    stored = await rows(writer, "SELECT tenant_id, idempotency_key FROM memories ORDER BY tenant_id, idempotency_key")
    assert [(r["tenant_id"], r["idempotency_key"]) for r in stored] == [("acme", "a1"), ("acme", "upper"),
                                                                        ("globex", "g1")]
    assert json.loads(dead[b"dead.reason"])["field"] == "event_id"  # the URN form: at once, alone
