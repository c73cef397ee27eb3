"""What Forget removes from Redis (adapters/stream_copies.py), against a real Redis.

The four streams that can hold a user's words: the published memory events, their dead letters, the
write commands still waiting, and the dead-lettered commands. A forget removes the forgotten's entries
from each, up to the mark taken at its commit, and nothing of another user or tenant, nor what came after.
"""

from __future__ import annotations

import uuid

import pytest

from libs.events import Envelope
from libs.events.bus import EventBus
from libs.protogen.mnemesh.v1 import common_pb2, events_pb2, memory_pb2
from services.memory_writer.adapters.stream_copies import RedisStreamCopies

pytestmark = pytest.mark.integration


def written(tenant: str, user: str, text: str) -> Envelope:
    memory = common_pb2.Memory(memory_id=str(uuid.uuid4()), tenant=common_pb2.TenantContext(
        tenant_id=tenant, user_id=user), content=text)
    return Envelope.wrap(events_pb2.MemoryWritten(memory=memory), event_type="memory.written", tenant_id=tenant)


def command(tenant: str, user: str, text: str) -> Envelope:
    return Envelope.wrap(memory_pb2.WriteMemoryRequest(tenant=common_pb2.TenantContext(user_id=user), content=text),
                         event_type="memory.write_requested", tenant_id=tenant)


async def contents(bus: EventBus, key: str) -> list[str]:
    redis = await bus.redis()
    return sorted(f.get(b"payload", f.get(b"original.payload", b"")).decode() for _, f in await redis.xrange(key))


@pytest.mark.parametrize("whole_tenant", [False, True])
async def test_a_forget_removes_the_forgottens_entries_from_every_stream_up_to_its_mark(
    redis_url: str, whole_tenant: bool
) -> None:
    bus = EventBus(redis_url, consumer_name="writer-1", namespace=f"c{uuid.uuid4().hex[:8]}")
    copies = RedisStreamCopies(bus)
    redis = await bus.redis()
    try:
        late = []  # entries whose dead letters are written only after the mark
        for tenant, user in (("acme", "u1"), ("acme", "u2"), ("globex", "u1")):
            note = f"{tenant} {user} lives at 3 Pear Road"
            for key, envelope in ((copies.events, written(tenant, user, note)),
                                  (copies.commands, command(tenant, user, note))):
                entry_id = await redis.xadd(key, envelope.to_fields())
                late.append((key, envelope, entry_id.decode()))
                await bus.dead_letter(key, envelope.to_fields(), {"error_type": "internal"})  # (no entry id)
        marks = await copies.mark()
        for key, envelope, entry_id in late:  # dead-lettered late, by a consumer that read them before the mark
            await bus.dead_letter(key, envelope.to_fields(), {"error_type": "internal"}, entry_id=entry_id)
        for key, envelope in ((copies.events, written("acme", "u1", "acme u1 starts afresh")),
                              (copies.commands, command("acme", "u1", "acme u1 starts afresh"))):
            entry_id = await redis.xadd(key, envelope.to_fields())
            await bus.dead_letter(key, envelope.to_fields(), {"error_type": "internal"}, entry_id=entry_id.decode())

        removed = await copies.purge("acme", "u1", [], whole_tenant=whole_tenant, until=marks)

        gone = {"acme u1"} | ({"acme u2"} if whole_tenant else set())
        assert removed == 6 * len(gone)  # per user: 2 entries, 4 dead letters
        for key in (copies.events, copies.dead_events, copies.commands, copies.dead_commands):
            left = "\n".join(await contents(bus, key))
            assert all(f"{who} lives" not in left for who in gone), key
            assert "globex u1 lives" in left and ("acme u2 lives" in left) != whole_tenant
            assert "acme u1 starts afresh" in left, key  # after the mark: a new start
    finally:
        await redis.delete(copies.events, copies.dead_events, copies.commands, copies.dead_commands)
        await bus.stop()


async def test_letters_whose_payloads_are_not_shaped_as_sent_do_not_stop_a_forget(redis_url: str) -> None:
    """Dead letters hold what producers sent, however wrong: a tenant that is a string or a list, a memory id
    that is an object, a payload nested too deep to read. A forget passes them by and removes the user's own."""
    bus = EventBus(redis_url, consumer_name="writer-1", namespace=f"c{uuid.uuid4().hex[:8]}")
    copies = RedisStreamCopies(bus)
    redis = await bus.redis()
    odd = ['{"tenant": "acme", "content": "x"}', '{"tenant": ["u1"], "content": "x"}', '["u1"]',
           '{"tenant": {"userId": "u1"}, "attributes": ' + '{"a": ' * 1500 + '1' + '}' * 1500 + '}']
    odd_events = ['{"memory": "u1"}', '{"memory": {"tenant": "acme"}}', '{"memoryId": {"id": "m1"}}']
    try:
        for payload in odd:
            await bus.dead_letter(copies.commands, {**command("acme", "u2", "x").to_fields(), "payload": payload},
                                  {"error_type": "malformed_event"})
        for payload in odd_events:
            for event_type in ("memory.written", "memory.corrected"):
                fields = {**written("acme", "u2", "x").to_fields(), "payload": payload, "event_type": event_type}
                await bus.dead_letter(copies.events, fields, {"error_type": "internal"})
        await bus.dead_letter(copies.commands, command("acme", "u1", "u1 lives at 3 Pear Road").to_fields(),
                              {"error_type": "validation"})

        removed = await copies.purge("acme", "u1", [str(uuid.uuid4())], until=await copies.mark())

        assert removed == 1
        assert "u1 lives" not in "\n".join(await contents(bus, copies.dead_commands))
        assert len(await redis.xrange(copies.dead_commands)) == len(odd)
    finally:
        await redis.delete(copies.events, copies.dead_events, copies.commands, copies.dead_commands)
        await bus.stop()
