"""Sensitive values never in plaintext: not in a pg_dump, not in any Redis stream, not in the logs.

A secret is written through gRPC and through the commands stream; afterwards the whole schema is
dumped with pg_dump, every Redis key of the run is read, and the service's log output is
searched. Forgetting the user destroys their key: the sealed copies left in the event store and
the streams can no longer be opened. Rotating the tenant key keeps every memory readable.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import asyncpg
import grpc
import pytest
import redis.asyncio

from libs.auth import issue_token
from libs.config import Settings, load_settings
from libs.crypto import LocalKeyFile
from libs.db import Database
from libs.events import Envelope
from libs.events.schema import MEMORY_COMMANDS, MEMORY_EVENTS
from libs.protogen.mnemesh.v1 import common_pb2, memory_pb2, memory_pb2_grpc
from libs.rpc import channel, error_detail
from mnemesh.infra import free_port
from mnemesh.supervisor import check_health
from services.memory_writer.adapters.keys import KeyRing, KeyShredded
from services.memory_writer.domain.entities import resident_id_check_digit

pytestmark = pytest.mark.integration
SECRET = "secrets-integration-secret-0123456789abc"
PASSWORD = "Tr0ub4dor&3x-zebra"
API_KEY = "sk-live-Q9pLmN4vX7rT2wK8sJ6h"
ID_NUMBER = "33010619850713" + "123" + resident_id_check_digit("33010619850713123")
SECRETS = (PASSWORD, API_KEY, ID_NUMBER)
PLAIN = "my sister lives at 17 Quince Lane, 桃花巷"  # nothing sensitive, but the user's all the same


@pytest.fixture
async def writer(redis_url: str, database_url: str, tmp_path) -> AsyncIterator[Settings]:
    """The memory-writer in a process of its own, logging at debug level into a file (`<data_dir>/writer.log`)."""
    namespace = f"s{uuid.uuid4().hex[:8]}"
    port = free_port()
    settings = load_settings(redis_url=redis_url, database_url=database_url, data_dir=tmp_path, namespace=namespace,
                             jwt_secret=SECRET, memory_writer_grpc_port=port)
    env = {**os.environ, "REDIS_URL": redis_url, "DATABASE_URL": database_url, "MNEMESH_NAMESPACE": namespace,
           "MNEMESH_JWT_SECRET": SECRET, "MNEMESH_METRICS_ENABLED": "false", "MNEMESH_DATA_DIR": str(tmp_path),
           "MNEMESH_MEMORY_WRITER_GRPC_PORT": str(port), "MNEMESH_OUTBOX_POLL_SECONDS": "0.1",
           "MNEMESH_MEMORY_BATCH_BLOCK_MS": "50", "MNEMESH_LOG_LEVEL": "debug", "MNEMESH_MASTER_KEY": "file:"}
    with open(tmp_path / "writer.log", "wb") as log:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "mnemesh", "serve", "memory-writer",
                                                    env=env, stdout=log, stderr=log)
    try:
        with anyio.fail_after(60):
            while not await check_health(f"127.0.0.1:{port}"):
                assert proc.returncode is None, (tmp_path / "writer.log").read_text()[-2000:]
                await anyio.sleep(0.1)
        yield settings
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await proc.wait()
        client = redis.asyncio.from_url(redis_url)
        keys = [k async for k in client.scan_iter(match=f"{namespace}.*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{namespace}_memory_writer" CASCADE')
        finally:
            await conn.close()


def stub(settings: Settings, scopes: list[str], subject: str = "agent-1"):
    token = issue_token(settings, subject=subject, tenant_id="acme", scopes=scopes)
    return channel(f"127.0.0.1:{settings.grpc_port('memory-writer')}", token)


def request(content: str, user: str = "u1", key: str = "") -> memory_pb2.WriteMemoryRequest:
    return memory_pb2.WriteMemoryRequest(
        tenant=common_pb2.TenantContext(tenant_id="acme", user_id=user), content=content, key=key,
        layer=common_pb2.MEMORY_LAYER_ENTITY if key else common_pb2.MEMORY_LAYER_LONG_TERM,
        source=common_pb2.SOURCE_KIND_USER_STATEMENT)


async def redis_contents(settings: Settings) -> str:
    """Every value of every Redis key of this run, as text (streams entry by entry)."""
    client = redis.asyncio.from_url(settings.redis_url)
    parts = []
    try:
        async for key in client.scan_iter(match=f"{settings.namespace}.*"):
            kind = (await client.type(key)).decode()
            if kind == "stream":
                parts += [json.dumps({k.decode(): v.decode("utf-8", "replace") for k, v in fields.items()})
                          for _, fields in await client.xrange(key)]
            elif kind == "string":
                parts.append((await client.get(key)).decode("utf-8", "replace"))
            parts.append(key.decode())
    finally:
        await client.aclose()
    return "\n".join(parts)


def pg_dump(settings: Settings) -> str:
    # The embedded-server package ships pg_dump 16, which dumps any older server too; the system's may
    # be older than the embedded server and refuse it.
    shipped = Path(importlib.util.find_spec("pgserver").origin).parent / "pginstall" / "bin" / "pg_dump"
    binary = str(shipped) if shipped.exists() else shutil.which("pg_dump")
    assert binary, "pg_dump is needed: reinstall the pinned packages (make setup)"
    return subprocess.run([binary, "--no-owner", "-n", f"{settings.namespace}_memory_writer", settings.database_url],
                          check=True, capture_output=True, text=True).stdout


async def client_xlen(settings: Settings, stream: str) -> int:
    client = redis.asyncio.from_url(settings.redis_url)
    try:
        return await client.xlen(f"{settings.namespace}.{stream}")
    finally:
        await client.aclose()


async def rows_of(settings: Settings, query: str) -> list:
    conn = await asyncpg.connect(settings.database_url,
                                 server_settings={"search_path": f"{settings.namespace}_memory_writer"})
    try:
        return await conn.fetch(query)
    finally:
        await conn.close()


async def events_published(settings: Settings, count: int) -> list[dict]:
    client = redis.asyncio.from_url(settings.redis_url)
    try:
        with anyio.fail_after(30):
            while len(entries := await client.xrange(f"{settings.namespace}.{MEMORY_EVENTS}")) < count:
                await anyio.sleep(0.05)
    finally:
        await client.aclose()
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]


async def test_a_secret_written_by_grpc_and_by_the_stream_is_nowhere_in_plaintext_and_shredded_on_forget(
    writer: Settings,
) -> None:
    async with stub(writer, ["*"]) as ch:
        api = memory_pb2_grpc.MemoryWriterStub(ch)
        by_grpc = await api.Write(request(f"my bank password is {PASSWORD} 别忘了"), timeout=10)
        by_key = await api.Write(request(ID_NUMBER, key="user.id_card"), timeout=10)
        plain = await api.Write(request(PLAIN), timeout=10)
        other = await api.Write(request("my brother lives at 3 Pear Road", user="u2"), timeout=10)
    producer = issue_token(writer, subject="crm", tenant_id="acme", scopes=["produce:mnemesh.memory.commands"])
    client = redis.asyncio.from_url(writer.redis_url)
    await client.xadd(f"{writer.namespace}.{MEMORY_COMMANDS}", Envelope.wrap(
        request(f"deploy with api key {API_KEY}"), event_type="memory.write_requested", tenant_id="acme",
        credential=producer).to_fields())
    refused = request("my cousin lives at 9 Plum Court")
    refused.layer = 99  # no such layer: dead-lettered, content and all (nothing sensitive to redact in it)
    await client.xadd(f"{writer.namespace}.{MEMORY_COMMANDS}", Envelope.wrap(
        refused, event_type="memory.write_requested", tenant_id="acme", credential=producer).to_fields())
    with anyio.fail_after(30):
        while not await client.xlen(f"{writer.namespace}.{MEMORY_COMMANDS}.dead"):
            await anyio.sleep(0.05)
    await client.aclose()
    events = await events_published(writer, 5)

    async with stub(writer, ["memory:read"]) as ch:
        hidden = await memory_pb2_grpc.MemoryWriterStub(ch).Get(
            memory_pb2.GetMemoryRequest(memory_id=by_grpc.memory_id), timeout=5)
    async with stub(writer, ["memory:read", "memory:sensitive"]) as ch:
        shown = await memory_pb2_grpc.MemoryWriterStub(ch).Get(
            memory_pb2.GetMemoryRequest(memory_id=by_grpc.memory_id), timeout=5)
    assert hidden.memory.content == "my bank password is [sensitive:password] 别忘了"
    assert hidden.memory.sensitive_kind == "password" and not hidden.memory.sealed_content
    assert shown.memory.content == f"my bank password is {PASSWORD} 别忘了"

    dump, streams, logs = pg_dump(writer), await redis_contents(writer), (writer.data_dir / "writer.log").read_text(encoding="utf-8", errors="replace")
    assert "[sensitive:api_key]" in dump and "[sensitive:password]" in streams  # the redacted texts are there
    assert "mnemesh.v1.MemoryWriter/Write" in logs  # the log was written (rpc lines at least)
    for secret in SECRETS:
        assert secret not in dump, "a secret is in the database dump"
        assert secret not in streams, "a secret is in a Redis stream"
        assert secret not in logs, "a secret is in the log output"
    sealed = [json.loads(e["payload"])["memory"] for e in events if e["event_type"] == "memory.written"
              and json.loads(e["payload"])["memory"]["memoryId"] not in (plain.memory_id, other.memory_id)]
    assert len(sealed) == 3 and all(m["sealedContent"] and m["sensitiveHashes"] for m in sealed)
    # The published copy of a plain memory carries its content (the read side indexes it); the event store's
    # copy only the sealed form.
    assert "9 Plum Court" in streams  # the dead letter keeps the refused command's content
    assert "17 Quince Lane" in streams and PLAIN not in "\n".join(
        r["payload"] for r in await rows_of(writer, "SELECT payload FROM events"))

    keys = KeyRing(LocalKeyFile(writer.data_dir / "master.key"))
    db = Database(writer.database_url, f"{writer.namespace}_memory_writer")
    await db.open()
    try:
        async with db.transaction("acme") as conn:  # the user's key opens what the events carry, before Forget
            assert len(await keys.user_key(conn, "acme", "u1", create=False)) == 32
        async with stub(writer, ["*"], subject="operator") as ch:
            forgotten = await memory_pb2_grpc.MemoryWriterStub(ch).Forget(
                memory_pb2.ForgetRequest(tenant=common_pb2.TenantContext(user_id="u1")), timeout=10)
        assert forgotten.forgotten == 4
        async with db.transaction("acme") as conn:
            with pytest.raises(KeyShredded):
                await keys.user_key(conn, "acme", "u1", create=False)
            stored = await conn.fetch("SELECT payload FROM events WHERE event_type = 'memory.written'")
        assert len(stored) == 5 and all(base64.b64decode(json.loads(r["payload"])["memory"]["sealedContent"])
                                        and not json.loads(r["payload"])["memory"].get("content") for r in stored)
        # Forgotten: the user's content is in no store the writer has (event store, outbox, streams), and
        # what is sealed can no longer be opened; another user's memory is untouched.
        dump, streams = pg_dump(writer), await redis_contents(writer)
        assert "17 Quince Lane" not in dump + streams and "桃花巷" not in dump  # (streams: JSON-escaped text)
        assert "9 Plum Court" not in streams  # its dead-lettered command is gone too
        assert "3 Pear Road" in streams
    finally:
        await db.close()
    async with stub(writer, ["*"]) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as gone:
            await memory_pb2_grpc.MemoryWriterStub(ch).Get(memory_pb2.GetMemoryRequest(memory_id=by_key.memory_id),
                                                           timeout=5)
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND


async def test_rotating_the_tenant_key_keeps_every_sensitive_memory_readable(writer: Settings) -> None:
    async with stub(writer, ["*"]) as ch:
        api = memory_pb2_grpc.MemoryWriterStub(ch)
        written = [await api.Write(request(f"{user}'s password is {PASSWORD}{i}", user=user), timeout=10)
                   for i, user in enumerate(["u1", "u2", "u3"])]
    before = await rows_of(writer, "SELECT user_id, wrapped, tenant_version FROM user_keys ORDER BY user_id")
    sealed_before = await rows_of(writer, "SELECT sealed FROM memories ORDER BY memory_id")
    async with stub(writer, ["memory:read", "memory:write"]) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await memory_pb2_grpc.MemoryWriterStub(ch).RotateTenantKey(memory_pb2.RotateTenantKeyRequest(), timeout=10)
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    async with stub(writer, ["memory:admin"]) as ch:
        rotated = await memory_pb2_grpc.MemoryWriterStub(ch).RotateTenantKey(memory_pb2.RotateTenantKeyRequest(),
                                                                             timeout=30)
    after = await rows_of(writer, "SELECT user_id, wrapped, tenant_version FROM user_keys ORDER BY user_id")
    sealed_after = await rows_of(writer, "SELECT sealed FROM memories ORDER BY memory_id")
    assert (rotated.version, rotated.rewrapped) == (2, 3)
    assert [r["tenant_version"] for r in after] == [2, 2, 2]
    assert all(a["wrapped"] != b["wrapped"] for a, b in zip(after, before, strict=True))
    assert sealed_after == sealed_before  # the content was not re-encrypted
    async with stub(writer, ["*"]) as ch:
        api = memory_pb2_grpc.MemoryWriterStub(ch)
        for i, reply in enumerate(written):
            got = await api.Get(memory_pb2.GetMemoryRequest(memory_id=reply.memory_id), timeout=5)
            assert got.memory.content.endswith(f"{PASSWORD}{i}")


async def test_a_secret_written_by_grpc_and_by_the_stream_is_not_in_the_retrievers_qdrant_payloads(
    writer: Settings, tmp_path,
) -> None:
    """The retriever projects the writer's events into its embedded Qdrant shard: no secret in a payload
    (read back through the engine) nor in any byte of the shard's files."""
    from services.retriever.adapters.vectors import COLLECTION, EdgeVectorIndex

    async with stub(writer, ["*"]) as ch:
        api = memory_pb2_grpc.MemoryWriterStub(ch)
        ids = [(await api.Write(request(f"my bank password is {PASSWORD} 别忘了"), timeout=10)).memory_id,
               (await api.Write(request(ID_NUMBER, key="user.id_card"), timeout=10)).memory_id,
               (await api.Write(request(PLAIN), timeout=10)).memory_id]
    producer = issue_token(writer, subject="crm", tenant_id="acme", scopes=["produce:mnemesh.memory.commands"])
    client = redis.asyncio.from_url(writer.redis_url)
    await client.xadd(f"{writer.namespace}.{MEMORY_COMMANDS}", Envelope.wrap(
        request(f"deploy with api key {API_KEY}"), event_type="memory.write_requested", tenant_id="acme",
        credential=producer).to_fields())
    await client.aclose()
    written = [json.loads(e["payload"])["memory"]["memoryId"] for e in await events_published(writer, 4)
               if e["event_type"] == "memory.written"]
    ids += [m for m in written if m not in ids]  # the one written through the stream
    assert len(ids) == 4

    data = tmp_path / "retriever"
    data.mkdir()
    env = {**os.environ, "REDIS_URL": writer.redis_url, "DATABASE_URL": writer.database_url,
           "MNEMESH_NAMESPACE": writer.namespace, "MNEMESH_DATA_DIR": str(data), "MNEMESH_EMBEDDER": "hash",
           "MNEMESH_METRICS_ENABLED": "false", "MNEMESH_RETRIEVER_GRPC_PORT": str(free_port()),
           "MNEMESH_LOG_LEVEL": "warning", "MNEMESH_JWT_SECRET": SECRET}
    schema = f"{writer.namespace}_retriever"
    with open(data / "retriever.log", "wb") as log:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "mnemesh", "serve", "retriever", env=env,
                                                    stdout=log, stderr=log)
    conn = await asyncpg.connect(writer.database_url)
    try:
        with anyio.fail_after(120):  # every memory projected: its vectors and payload written
            while not (await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", f"{schema}.documents_unprojected") and
                       await conn.fetchval(f'SELECT count(*) FROM "{schema}".documents WHERE projected') == 4):
                assert proc.returncode is None, (data / "retriever.log").read_text()[-2000:]
                await anyio.sleep(0.1)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await proc.wait()
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()
    shard = next((data / "qdrant").glob(f"{COLLECTION}-*"))
    index = EdgeVectorIndex(shard, dim=int(shard.name.rsplit("-", 1)[1]))
    try:
        payloads = index.retrieve("acme", ids)
    finally:
        index.close()
    assert set(payloads) == set(ids)
    assert payloads[ids[2]]["content"] == PLAIN  # a plain memory's payload carries its content (the test can see it)
    raw = b"".join(p.read_bytes() for p in shard.rglob("*") if p.is_file())
    for secret in SECRETS:
        assert secret not in json.dumps(payloads, ensure_ascii=False), "a secret is in a Qdrant payload"
        assert secret.encode() not in raw, "a secret is in the Qdrant shard's files"


async def test_a_users_reasons_tags_and_attributes_are_only_sealed_in_the_event_store_and_gone_once_forgotten(
    writer: Settings,
) -> None:
    """Not only a memory's content is the user's words: its tags and attributes, a merged write's tags, the
    reason of a correction or a confirmation too. The event store keeps them only sealed under the user's key
    (`sealedFields`); the published copies carry the tags and attributes the read side uses, never a reason,
    and Forget deletes them, from the outbox and the stream."""
    tag, attribute, merged_tag, lone_tag = "tag-ostrich-7", "attr-walrus-7", "tag-gecko-7", "tag-lynx-7"
    corrected_because, confirmed_because = "reason-pelican-7 我搬家了", "reason-heron-7"
    tenant = common_pb2.TenantContext(tenant_id="acme", user_id="u1")
    async with stub(writer, ["*"]) as ch:
        api = memory_pb2_grpc.MemoryWriterStub(ch)
        first = request("I walk to work along the river")
        first.tags.append(tag)
        first.attributes.update({"note": attribute})
        await api.Write(first, timeout=10)
        again = request("I walk to work along the river")  # identical: merged into the first
        again.tags.append(merged_tag)
        assert (await api.Write(again, timeout=10)).status == memory_pb2.WRITE_STATUS_MERGED
        lone = request("I cycle on Sundays")  # tags and no attributes: the printed-directly path
        lone.tags.append(lone_tag)
        await api.Write(lone, timeout=10)
        await api.Write(request("Wang", key="user.name"), timeout=10)
        await api.Correct(memory_pb2.CorrectRequest(tenant=tenant, key="user.name", content="Li",
                                                    reason=corrected_because), timeout=10)
        guess = request("Hangzhou", key="user.city")
        guess.confidence = common_pb2.CONFIDENCE_L2_MEDIUM
        guessed = await api.Write(guess, timeout=10)
        await api.Confirm(memory_pb2.ConfirmRequest(tenant=tenant, memory_id=guessed.memory_id,
                                                    reason=confirmed_because), timeout=10)
    published, reasons = (tag, attribute, merged_tag, lone_tag), ("reason-pelican-7", confirmed_because)
    with anyio.fail_after(30):  # published: the read side gets what it uses
        while True:
            streams = await redis_contents(writer)
            if all(w in streams for w in published) and '"memory.confirmed"' in streams:
                break
            await anyio.sleep(0.1)
    assert not any(w in streams for w in reasons)  # a reason is never published
    stored = [(r["event_type"], json.loads(r["payload"])) for r in await rows_of(
        writer, "SELECT event_type, payload FROM events")]
    assert not any(w in json.dumps(p, ensure_ascii=False) for _, p in stored
                   for w in (*published, *reasons, corrected_because))
    assert sorted(t for t, p in stored if p.get("sealedFields")) == [
        "memory.confirmed", "memory.corrected", "memory.merged", "memory.written", "memory.written"]
    async with stub(writer, ["*"], subject="operator") as ch:
        await memory_pb2_grpc.MemoryWriterStub(ch).Forget(memory_pb2.ForgetRequest(tenant=tenant), timeout=10)
    dump, streams = pg_dump(writer), await redis_contents(writer)
    for word in (*published, *reasons, corrected_because):
        assert word not in dump, f"{word!r} is in the database dump"
        assert word not in streams, f"{word!r} is in a Redis stream"


async def test_a_tenants_own_contacts_rule_is_set_over_grpc_and_seals_its_phone_numbers(writer: Settings) -> None:
    """The deployment leaves contacts plain (no MNEMESH_MEMORY_SENSITIVE_CONTACTS); the tenant's own rule,
    set over gRPC, makes its phone numbers sensitive for writes through gRPC and the stream alike."""
    plain_phone, grpc_phone, stream_phone = "13812345678", "13987654321", "13700001111"
    async with stub(writer, ["memory:read"]) as ch:
        api = memory_pb2_grpc.MemoryWriterStub(ch)
        before = await api.GetTenantPolicy(memory_pb2.GetTenantPolicyRequest(), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await api.SetTenantPolicy(memory_pb2.SetTenantPolicyRequest(
                contacts=memory_pb2.CONTACTS_POLICY_SENSITIVE), timeout=5)
    assert (before.contacts, before.contacts_sensitive) == (memory_pb2.CONTACTS_POLICY_UNSPECIFIED, False)
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    async with stub(writer, ["*"]) as ch:
        api = memory_pb2_grpc.MemoryWriterStub(ch)
        plain = await api.Write(request(f"call me on {plain_phone}"), timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await api.SetTenantPolicy(memory_pb2.SetTenantPolicyRequest(contacts=7), timeout=5)
        now = await api.SetTenantPolicy(memory_pb2.SetTenantPolicyRequest(
            contacts=memory_pb2.CONTACTS_POLICY_SENSITIVE), timeout=5)
        sensitive = await api.Write(request(f"call me on {grpc_phone}"), timeout=10)
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and error_detail(bad.value).field == "contacts"
    assert (now.contacts, now.contacts_sensitive) == (memory_pb2.CONTACTS_POLICY_SENSITIVE, True)
    producer = issue_token(writer, subject="crm", tenant_id="acme", scopes=["produce:mnemesh.memory.commands"])
    client = redis.asyncio.from_url(writer.redis_url)
    try:
        await client.xadd(f"{writer.namespace}.{MEMORY_COMMANDS}", Envelope.wrap(
            request(f"my number is {stream_phone}"), event_type="memory.write_requested", tenant_id="acme",
            credential=producer).to_fields())
    finally:
        await client.aclose()
    async with stub(writer, ["memory:read"]) as ch:
        api = memory_pb2_grpc.MemoryWriterStub(ch)
        shown = await api.Get(memory_pb2.GetMemoryRequest(memory_id=plain.memory_id), timeout=5)
        hidden = await api.Get(memory_pb2.GetMemoryRequest(memory_id=sensitive.memory_id), timeout=5)
    assert shown.memory.content == f"call me on {plain_phone}"  # written before the rule: left as it was
    assert hidden.memory.content == "call me on [sensitive:phone]" and hidden.memory.sensitive_kind == "phone"
    with anyio.fail_after(30):  # the stream's command is written, and its entry acknowledged and deleted
        while len(await rows_of(writer, "SELECT 1 FROM memories")) < 3 or await client_xlen(writer, MEMORY_COMMANDS):
            await anyio.sleep(0.05)
    dump, streams = pg_dump(writer), await redis_contents(writer)
    assert plain_phone in dump
    for phone in (grpc_phone, stream_phone):
        assert phone not in dump and phone not in streams
    async with stub(writer, ["memory:admin", "memory:read"]) as ch:
        dropped = await memory_pb2_grpc.MemoryWriterStub(ch).SetTenantPolicy(memory_pb2.SetTenantPolicyRequest(
            contacts=memory_pb2.CONTACTS_POLICY_UNSPECIFIED), timeout=5)
    assert (dropped.contacts, dropped.contacts_sensitive) == (memory_pb2.CONTACTS_POLICY_UNSPECIFIED, False)


async def test_forgetting_one_memory_erases_what_the_event_store_holds_sealed_of_it(writer: Settings) -> None:
    """Forget(memory id) leaves the user's key alive, so the sealed copies of that memory in the event store
    are erased (content, keyed hashes, tags): its events stay, empty of it; the user's other memories keep
    theirs."""
    async with stub(writer, ["*"]) as ch:
        api = memory_pb2_grpc.MemoryWriterStub(ch)
        doomed = request(f"my bank password is {PASSWORD}")
        doomed.tags.append("tag-marten-7")
        gone = await api.Write(doomed, timeout=10)
        kept = await api.Write(request(PLAIN), timeout=10)
        forgotten = await api.Forget(memory_pb2.ForgetRequest(memory_id=gone.memory_id), timeout=10)
    assert forgotten.forgotten == 1
    rows = await rows_of(writer, "SELECT stream_id, event_type, payload FROM events")
    of_gone = [json.loads(r["payload"]) for r in rows if r["stream_id"] == f"memory-{gone.memory_id}"]
    assert len(of_gone) == 2  # its memory.written and memory.forgotten remain, as facts
    assert not any(word in json.dumps(p) for p in of_gone
                   for word in ("sealedContent", "sealedFields", "sensitiveHashes", "tag-marten-7"))
    [kept_written] = [json.loads(r["payload"]) for r in rows if r["stream_id"] == f"memory-{kept.memory_id}"]
    assert kept_written["memory"]["sealedContent"]  # the user's other memory: still sealed there, openable
    assert "tag-marten-7" not in await redis_contents(writer)  # its published copy is gone too
