"""The memory-writer's rules and handlers, through a fake unit of work."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from fakes import NOW, FakeUnitOfWork, MemoryDatabase, a_write

from libs.errors import Conflict, IdempotencyKeyReused, NotFound, PermissionDenied, ValidationFailed
from services.memory_writer.domain import (
    Confidence,
    Layer,
    MemoryForgotten,
    MemoryWritten,
    Source,
    new_memory,
)
from services.memory_writer.domain.policy import WritePolicy
from services.memory_writer.entrypoints.streams import scrub_command
from services.memory_writer.service_layer import handlers as handlers_module
from services.memory_writer.service_layer.handlers import (
    ForgetMemory,
    ForgetTenant,
    GetMemory,
    SetTenantPolicy,
    TenantForgotten,
    forget,
    forget_tenant,
    get_memory,
    set_tenant_policy,
    write_memory,
)



@pytest.fixture
def db() -> MemoryDatabase:
    return MemoryDatabase()


# --- new_memory --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("changes", "bad_field"), [
    ({"tenant_id": "  "}, "tenant.tenant_id"),
    ({"user_id": ""}, "tenant.user_id"),
    ({"layer": 0}, "layer"),
    ({"layer": 99}, "layer"),
    ({"source": 42}, "source"),
    ({"content": " \n\t "}, "content"),
    ({"content": "\u200b\ufeff\u200b \u2060"}, "content"),
    ({"content": "x" * 15_000}, "content"),
    ({"content": "hello\x00world"}, "content"),
    ({"tenant_id": "evil tenant/.."}, "tenant.tenant_id"),
    ({"user_id": "\u200b"}, "tenant.user_id"),
    ({"content": "x" * 16_001}, "content"),
    ({"layer": Layer.STEP}, "step_id"),
    ({"layer": Layer.ENTITY}, "key"),
    ({"tags": tuple(f"t{i}" for i in range(33))}, "tags"),
    ({"tags": ("ok", "")}, "tags[1]"),
    ({"tags": ("x" * 65,)}, "tags[0]"),
    ({"confidence": 7}, "confidence"),
    ({"expires_at": NOW - timedelta(seconds=1)}, "expires_at"),
    ({"expires_at": NOW}, "expires_at"),
])
def test_a_bad_write_is_refused_naming_the_field(changes: dict, bad_field: str) -> None:
    with pytest.raises(ValidationFailed) as err:
        new_memory(a_write(**changes), now=NOW)
    assert err.value.field == bad_field
    assert err.value.error_type == "validation"


def test_a_secret_in_tags_or_attributes_is_redacted_since_they_are_stored_as_sent() -> None:
    write = a_write(tags=("travel", "password=Hunter2Secret99"), attributes={
        "note": "my password is Hunter2Secret99", "wifi": {"password": "Tr1cky#Pass", "ssid": "home"},
        "secret": {"value": "Tr1cky#Pass"}, "cards": ["none", "6222 0212 3456 7890 128"],
        "id": "身份证 33010619900101123X", "sk-live-4fd8a9c0e1b2c3d4e5f6a7b8": 1})
    record = new_memory(write, now=NOW)
    stored = json.dumps([record.tags, record.attributes], ensure_ascii=False)
    for secret in ("Hunter2Secret99", "Tr1cky#Pass", "6222 0212 3456 7890 128", "33010619900101123X", "sk-live-4fd8"):
        assert secret not in stored, secret
    assert record.tags[0] == "travel" and record.attributes["wifi"]["ssid"] == "home"
    assert "[sensitive:password]" in record.tags[1] and record.attributes["secret"] == {"value": "[sensitive:secret]"}
    assert not record.sensitive_kind  # the content holds nothing to seal


def test_tags_and_attributes_without_secrets_are_kept_and_contacts_only_where_the_tenant_seals_them() -> None:
    plain = a_write(tags=("travel", "订单 2024-11"), attributes={"seat": "aisle", "note": {"lang": "中文"},
                                                                 "trigger": "task 7: reset my password"})
    record = new_memory(plain, now=NOW)
    assert record.tags == ("travel", "订单 2024-11") and record.attributes == dict(plain.attributes)
    contact = a_write(tags=("call 138 1234 5678",))
    assert new_memory(contact, now=NOW).tags == ("call 138 1234 5678",)
    assert "138" not in new_memory(contact, now=NOW, contacts_sensitive=True).tags[0]


@pytest.mark.parametrize(("source", "confidence"), [
    (Source.AUTHORITATIVE_API, Confidence.L1_STRONG),
    (Source.USER_STATEMENT, Confidence.L1_STRONG),
    (Source.MODEL_INFERENCE, Confidence.L2_MEDIUM),
    (Source.THIRD_PARTY, Confidence.L3_WEAK),
])
def test_a_memory_without_a_confidence_gets_the_default_of_its_source(source: Source,
                                                                     confidence: Confidence) -> None:
    assert new_memory(a_write(source=source), now=NOW).confidence is confidence


def test_an_explicit_weaker_confidence_overrides_the_default_of_the_source() -> None:
    record = new_memory(a_write(source=Source.USER_STATEMENT, confidence=Confidence.L2_MEDIUM), now=NOW)
    assert record.confidence is Confidence.L2_MEDIUM
    assert record.expires_at is None


@pytest.mark.parametrize(("source", "claimed"), [
    (Source.THIRD_PARTY, Confidence.L1_STRONG), (Source.THIRD_PARTY, Confidence.L2_MEDIUM),
    (Source.MODEL_INFERENCE, Confidence.L1_STRONG)])
def test_a_source_cannot_claim_more_confidence_than_its_trust_allows(source, claimed) -> None:
    with pytest.raises(ValidationFailed) as err:
        new_memory(a_write(source=source, confidence=claimed), now=NOW)
    assert err.value.field == "confidence"
    assert source.name.lower() in err.value.reason


def test_a_weak_memory_expires_after_24_hours_by_default() -> None:
    record = new_memory(a_write(source=Source.MODEL_INFERENCE, confidence=Confidence.L3_WEAK), now=NOW)
    assert record.expires_at == NOW + timedelta(hours=24)


def test_a_weak_memory_keeps_the_expiry_it_was_given() -> None:
    later = NOW + timedelta(days=3)
    record = new_memory(a_write(source=Source.THIRD_PARTY, expires_at=later), now=NOW)
    assert record.expires_at == later


def test_a_strong_memory_does_not_expire_by_default() -> None:
    assert new_memory(a_write(), now=NOW).expires_at is None


def test_a_step_memory_with_a_step_id_and_an_entity_memory_with_a_key_are_accepted() -> None:
    step = new_memory(a_write(layer=Layer.STEP, step_id="step-7"), now=NOW)
    entity = new_memory(a_write(layer=Layer.ENTITY, key="user.phone", content="138 1234 5678"), now=NOW)
    assert (step.layer, step.step_id) == (Layer.STEP, "step-7")
    assert (entity.layer, entity.key) == (Layer.ENTITY, "user.phone")
    assert entity.content == "13812345678"


def test_content_is_stored_without_surrounding_whitespace_and_stamped_with_now() -> None:
    record = new_memory(a_write(content="  likes jazz \n"), now=NOW)
    assert record.content == "likes jazz"
    assert record.created_at == NOW
    assert record.layer is Layer.LONG_TERM and record.source is Source.USER_STATEMENT


# --- write_memory ------------------------------------------------------------------------------------------


async def test_a_write_stores_the_memory_and_records_memory_written_on_its_own_stream(db) -> None:
    uow = FakeUnitOfWork(db)
    result = await write_memory(a_write(), uow)

    assert uow.committed and not uow.rolled_back
    assert not result.duplicate and result.version == 1
    stored = db.rows[result.memory_id]
    assert stored.content == "prefers tea over coffee"
    assert db.published == [(f"memory-{result.memory_id}", MemoryWritten(stored))]


async def test_a_retry_with_the_same_idempotency_key_returns_the_first_memory(db) -> None:
    first = await write_memory(a_write(idempotency_key="k-1"), FakeUnitOfWork(db))
    second = await write_memory(a_write(idempotency_key="k-1"), FakeUnitOfWork(db))

    assert second.duplicate and second.memory_id == first.memory_id
    assert list(db.rows) == [first.memory_id]
    assert len(db.published) == 1


@pytest.mark.parametrize("changes", [{"content": "something else"}, {"layer": Layer.ENTITY, "key": "user.drink"},
                                     {"tags": ("diet",)}, {"user_id": "u2"}])
async def test_a_different_write_under_a_used_idempotency_key_is_refused_not_dropped(db, changes) -> None:
    first = await write_memory(a_write(idempotency_key="k-1"), FakeUnitOfWork(db))
    with pytest.raises(IdempotencyKeyReused) as refused:
        await write_memory(a_write(idempotency_key="k-1", **changes), FakeUnitOfWork(db))

    assert refused.value.field == "idempotency_key" and not refused.value.retryable
    assert list(db.rows) == [first.memory_id]
    assert db.rows[first.memory_id].content == "prefers tea over coffee"
    assert len(db.published) == 1


async def test_the_same_idempotency_key_in_another_tenant_writes_a_new_memory(db) -> None:
    first = await write_memory(a_write(idempotency_key="k-1"), FakeUnitOfWork(db))
    other = await write_memory(a_write(idempotency_key="k-1", tenant_id="globex"), FakeUnitOfWork(db))
    assert not other.duplicate and other.memory_id != first.memory_id


async def test_different_writes_without_an_idempotency_key_are_never_duplicates(db) -> None:
    one = await write_memory(a_write(), FakeUnitOfWork(db))
    two = await write_memory(a_write(content="prefers green tea in the morning"), FakeUnitOfWork(db))
    assert not one.duplicate and not two.duplicate and one.memory_id != two.memory_id
    # (the same content again is merged into the first: see test_memory_writer_dedup.py)


async def test_an_invalid_write_touches_nothing(db) -> None:
    uow = FakeUnitOfWork(db)
    with pytest.raises(ValidationFailed):
        await write_memory(a_write(content=""), uow)
    assert not uow.committed and db.rows == {} and db.published == []


async def test_a_write_whose_event_cannot_be_recorded_is_rolled_back_with_its_row(db) -> None:
    uow = FakeUnitOfWork(db, fail_record=Conflict("stream moved", field="expected_version"))
    with pytest.raises(Conflict):
        await write_memory(a_write(), uow)
    assert uow.rolled_back and not uow.committed
    assert db.rows == {} and db.published == []


# --- get_memory --------------------------------------------------------------------------------------------


async def test_a_written_memory_can_be_read_back(db) -> None:
    result = await write_memory(a_write(), FakeUnitOfWork(db))
    record, _ = await get_memory(GetMemory("acme", result.memory_id), FakeUnitOfWork(db))
    assert record.memory_id == result.memory_id and record.user_id == "u1"


async def test_reading_an_unknown_memory_is_not_found_naming_memory_id(db) -> None:
    with pytest.raises(NotFound) as err:
        await get_memory(GetMemory("acme", "00000000-0000-0000-0000-000000000000"), FakeUnitOfWork(db))
    assert err.value.field == "memory_id"


async def test_reading_another_tenants_memory_is_not_found(db) -> None:
    theirs = await write_memory(a_write(tenant_id="globex"), FakeUnitOfWork(db))
    with pytest.raises(NotFound):
        await get_memory(GetMemory("acme", theirs.memory_id), FakeUnitOfWork(db))


# --- forget ------------------------------------------------------------------------------------------------


async def test_forgetting_one_memory_deletes_it_and_records_memory_forgotten(db) -> None:
    keep = await write_memory(a_write(content="keep me"), FakeUnitOfWork(db))
    drop = await write_memory(a_write(content="drop me"), FakeUnitOfWork(db))
    uow = FakeUnitOfWork(db)

    assert await forget(ForgetMemory("acme", "u1", drop.memory_id, requested_by="u1"), uow) == 1

    assert uow.committed
    assert uow.events == [(f"memory-{drop.memory_id}",
                           MemoryForgotten("acme", "u1", (drop.memory_id,), "forget requested"))]
    assert list(db.rows) == [keep.memory_id]
    with pytest.raises(NotFound):
        await get_memory(GetMemory("acme", drop.memory_id), FakeUnitOfWork(db))


async def test_forgetting_all_of_a_user_deletes_only_that_users_memories(db) -> None:
    mine = [(await write_memory(a_write(content=f"note {i}"), FakeUnitOfWork(db))).memory_id for i in range(3)]
    theirs = await write_memory(a_write(user_id="u2"), FakeUnitOfWork(db))
    other_tenant = await write_memory(a_write(tenant_id="globex"), FakeUnitOfWork(db))
    uow = FakeUnitOfWork(db)

    assert await forget(ForgetMemory("acme", "u1", requested_by="u1"), uow) == 3

    assert uow.withheld_after == 1  # publication withheld last, after the purge and the event
    [(stream, event)] = uow.events
    assert stream == "memory-user-acme-u1"
    assert isinstance(event, MemoryForgotten)
    assert (event.tenant_id, event.user_id) == ("acme", "u1")
    assert sorted(event.memory_ids) == sorted(mine)
    assert set(db.rows) == {theirs.memory_id, other_tenant.memory_id}


class RacingUnitOfWork(FakeUnitOfWork):
    """Another transaction forgets `vanished` between listing the user's memories and deleting them."""

    def __init__(self, db: MemoryDatabase, vanished: str) -> None:
        super().__init__(db)
        self.vanished = vanished

    async def ids_of_user(self, tenant_id: str, user_id: str) -> list[str]:
        ids = await super().ids_of_user(tenant_id, user_id)
        del self._rows[self.vanished]
        return ids


async def test_forgetting_all_of_a_user_records_only_the_ids_actually_deleted(db) -> None:
    gone = (await write_memory(a_write(content="gone already"), FakeUnitOfWork(db))).memory_id
    left = (await write_memory(a_write(content="still here"), FakeUnitOfWork(db))).memory_id
    uow = RacingUnitOfWork(db, vanished=gone)

    assert await forget(ForgetMemory("acme", "u1", requested_by="u1"), uow) == 1

    [(_, event)] = uow.events
    assert event.memory_ids == (left,)


async def test_forgetting_a_memory_of_another_tenant_deletes_nothing_and_records_nothing(db) -> None:
    theirs = await write_memory(a_write(tenant_id="globex"), FakeUnitOfWork(db))
    uow = FakeUnitOfWork(db)
    assert await forget(ForgetMemory("acme", "u1", theirs.memory_id, requested_by="u1"), uow) == 0
    assert uow.events == []
    assert theirs.memory_id in db.rows


async def test_forgetting_a_user_with_no_memories_records_nothing(db) -> None:
    uow = FakeUnitOfWork(db)
    assert await forget(ForgetMemory("acme", "nobody", requested_by="nobody"), uow) == 0
    assert uow.events == [] and db.published == []


async def test_forgetting_a_tenant_deletes_every_users_memories_rules_and_keys_and_nothing_of_another(db) -> None:
    u1 = [(await write_memory(a_write(content=f"note {i}"), FakeUnitOfWork(db))).memory_id for i in range(2)]
    secret = await write_memory(a_write(content="my password is hunter22-Blue"), FakeUnitOfWork(db))
    u2 = await write_memory(a_write(user_id="u2"), FakeUnitOfWork(db))
    other = await write_memory(a_write(tenant_id="globex", content="my password is hunter22-Blue"), FakeUnitOfWork(db))
    await set_tenant_policy(SetTenantPolicy("acme", True, "admin"), FakeUnitOfWork(db))
    await set_tenant_policy(SetTenantPolicy("globex", True, "admin"), FakeUnitOfWork(db))
    db.schemas[("acme", "user.plan")] = db.schemas[("globex", "user.plan")] = {"type": "string"}
    assert ("acme", "u1") in db.user_keys
    uow = FakeUnitOfWork(db)

    done = await forget_tenant(ForgetTenant("acme", confirm_tenant_id="acme"), uow)

    assert done == TenantForgotten(memories=4, users=1) and uow.committed
    assert list(db.rows) == [other.memory_id]
    assert [k for k in db.user_keys if k[0] == "acme"] == [] and ("globex", "u1") in db.user_keys
    assert db.contacts == {"globex": True} and list(db.schemas) == [("globex", "user.plan")]
    assert (uow.purged, uow.erased) == (("acme", "*", ()), ("acme", None))
    assert uow.withheld_after == len(uow.events)  # publication withheld last, after the purge and the events
    assert [(stream, e.user_id, sorted(e.memory_ids), e.reason) for stream, e in uow.events] == [
        ("memory-user-acme-u1", "u1", sorted([*u1, secret.memory_id]), "tenant forgotten"),
        ("memory-user-acme-u2", "u2", [u2.memory_id], "tenant forgotten")]


async def test_forgetting_a_tenant_names_its_memories_in_events_of_bounded_size(db, monkeypatch) -> None:
    monkeypatch.setattr(handlers_module, "FORGOTTEN_IDS_PER_EVENT", 2)
    ids = [(await write_memory(a_write(content=f"note {i}"), FakeUnitOfWork(db))).memory_id for i in range(5)]
    uow = FakeUnitOfWork(db)
    await forget_tenant(ForgetTenant("acme", "acme"), uow)
    assert [len(e.memory_ids) for _, e in uow.events] == [2, 2, 1]
    assert sorted(m for _, e in uow.events for m in e.memory_ids) == sorted(ids)


@pytest.mark.parametrize("confirm", ["", "globex", "ACME"])
async def test_forgetting_a_tenant_needs_its_id_repeated_and_touches_nothing_otherwise(db, confirm) -> None:
    kept = await write_memory(a_write(), FakeUnitOfWork(db))
    uow = FakeUnitOfWork(db)
    with pytest.raises(ValidationFailed) as refused:
        await forget_tenant(ForgetTenant("acme", confirm), uow)
    assert refused.value.field == "confirm_tenant_id" and "acme" in refused.value.reason
    assert list(db.rows) == [kept.memory_id] and uow.events == []


# --- commands from the stream and forgetting by default --------------------------------------------------


async def test_a_stream_command_takes_the_tenant_it_was_published_under(db: MemoryDatabase) -> None:
    result = await write_memory(a_write(tenant_id=""), FakeUnitOfWork(db), on_behalf_of="acme")
    async with FakeUnitOfWork(db) as uow:
        assert (await uow.get("acme", result.memory_id)).tenant_id == "acme"


async def test_a_stream_command_naming_another_tenant_is_refused(db: MemoryDatabase) -> None:
    with pytest.raises(ValidationFailed) as err:
        await write_memory(a_write(tenant_id="globex"), FakeUnitOfWork(db), on_behalf_of="acme")
    assert err.value.field == "tenant.tenant_id" and "published under 'acme'" in err.value.reason


async def test_forget_without_an_id_or_user_forgets_the_callers_memories(db: MemoryDatabase) -> None:
    mine = await write_memory(a_write(user_id="caller"), FakeUnitOfWork(db))
    theirs = await write_memory(a_write(user_id="someone-else"), FakeUnitOfWork(db))
    assert await forget(ForgetMemory("acme", "", requested_by="caller"), FakeUnitOfWork(db)) == 1
    async with FakeUnitOfWork(db) as uow:
        assert await uow.get("acme", mine.memory_id) is None
        assert await uow.get("acme", theirs.memory_id) is not None


async def test_forgetting_another_users_memories_needs_the_admin_scope(db: MemoryDatabase) -> None:
    theirs = await write_memory(a_write(user_id="u2"), FakeUnitOfWork(db))
    for cmd in (ForgetMemory("acme", "u2", requested_by="u1"),
                ForgetMemory("acme", "", theirs.memory_id, requested_by="u1")):
        with pytest.raises(PermissionDenied) as err:
            await forget(cmd, FakeUnitOfWork(db))
        assert "memory:admin" in err.value.reason
    assert theirs.memory_id in db.rows
    assert await forget(ForgetMemory("acme", "", theirs.memory_id, requested_by="ops", admin=True),
                        FakeUnitOfWork(db)) == 1


async def test_forget_with_nobody_to_forget_is_refused(db: MemoryDatabase) -> None:
    with pytest.raises(ValidationFailed) as err:
        await forget(ForgetMemory("acme", ""), FakeUnitOfWork(db))
    assert err.value.field == "tenant.user_id"


async def test_phones_and_emails_are_sealed_only_for_tenants_whose_policy_makes_them_sensitive(db) -> None:
    policy = WritePolicy.of(120, "acme, initech")
    content = "call me on 138 1234 5678 or mail zhang.wei@example.cn"
    strict = await write_memory(a_write(content=content), FakeUnitOfWork(db), now=NOW, policy=policy)
    relaxed = await write_memory(a_write(tenant_id="globex", content=content), FakeUnitOfWork(db), now=NOW,
                                 policy=policy)
    sealed, plain = db.rows[strict.memory_id], db.rows[relaxed.memory_id]
    assert sealed.sensitive_kind and "13812345678" not in sealed.content and "example.cn" not in sealed.content
    assert not plain.sensitive_kind and plain.content == content
    assert WritePolicy.of(120, "*").contacts_sensitive("anyone") and not WritePolicy().contacts_sensitive("acme")
    fields = {"tenant_id": "acme", "payload": json.dumps({"content": content})}
    assert "13812345678" not in scrub_command(fields)["payload"].replace(" ", "")
    # a dead letter redacts contacts whatever the tenant's rule (it may change before a replay)
    assert "example.cn" not in scrub_command({**fields, "tenant_id": "globex"})["payload"]


async def test_a_tenants_own_contacts_rule_overrides_the_deployments_and_can_be_dropped(db: MemoryDatabase) -> None:
    deployment = WritePolicy.of(120, "*")  # every tenant's contacts sensitive
    content = "call me on 138 1234 5678"

    async def sealed(tenant_id: str) -> bool:
        result = await write_memory(a_write(tenant_id=tenant_id, content=f"{content} #{len(db.rows)}"),
                                    FakeUnitOfWork(db), now=NOW, policy=deployment)
        return bool(db.rows[result.memory_id].sensitive_kind)

    assert await sealed("acme")
    await set_tenant_policy(SetTenantPolicy("acme", False, "admin"), FakeUnitOfWork(db))
    assert db.contacts == {"acme": False}
    assert not await sealed("acme") and await sealed("globex")  # only acme's rule changed
    await set_tenant_policy(SetTenantPolicy("acme", None, "admin"), FakeUnitOfWork(db))
    assert await sealed("acme")  # no rule of its own: the deployment's again
    assert WritePolicy().for_tenant("acme", True).contacts_sensitive("acme")
    assert not WritePolicy().for_tenant("acme", True).contacts_sensitive("globex")
    with pytest.raises(ValidationFailed) as refused:
        await set_tenant_policy(SetTenantPolicy("", True), FakeUnitOfWork(db))
    assert refused.value.field == "tenant.tenant_id"
