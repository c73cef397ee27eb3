"""gRPC MemoryWriter: translate requests to commands and results to responses, nothing more."""

from __future__ import annotations

from dataclasses import replace

import asyncpg
from google.protobuf import json_format

from libs.auth import current_principal
from libs.errors import DomainError, Internal, PermissionDenied, ValidationFailed
from libs.logs import get_logger
from libs.protogen.mnemesh.v1 import common_pb2, memory_pb2, memory_pb2_grpc
from libs.rpc import Registration
from libs.validation import check_items, quote
from services.memory_writer.adapters.mapping import (
    command_from_proto,
    memory_to_proto,
    result_to_proto,
    timestamp,
)
from services.memory_writer.domain import WriteResult
from services.memory_writer.domain.compression import Triggers
from services.memory_writer.domain.policy import DEFAULT_POLICY, WritePolicy
from services.memory_writer.service_layer import handlers
from services.memory_writer.service_layer.compression import CompressSession, Summarizer, compress_session
from services.memory_writer.service_layer.unit_of_work import StreamCopies, UnitOfWorkFactory

__all__ = ["registration", "write_error"]

log = get_logger(__name__)
DEFAULT_TRIGGERS = Triggers()

SCOPES = {"Write": "memory:write", "Get": "memory:read", "Forget": "memory:forget", "ForgetTenant": "memory:admin",
          "RotateTenantKey": "memory:admin",
          "WriteBatch": "memory:write",
          "Correct": "memory:write", "Confirm": "memory:write", "History": "memory:read",
          "RegisterEntitySchema": "memory:admin", "SetTenantPolicy": "memory:admin", "GetTenantPolicy": "memory:read",
          "ListQuarantine": "memory:admin", "Release": "memory:admin",
          "Drop": "memory:admin", "CompressSession": "memory:write"}


_CONTACTS_RULE = {memory_pb2.CONTACTS_POLICY_UNSPECIFIED: None, memory_pb2.CONTACTS_POLICY_SENSITIVE: True,
                  memory_pb2.CONTACTS_POLICY_PLAIN: False}


def _caller() -> str:
    principal = current_principal.get()
    return principal.subject if principal else ""


def _may_see_sensitive() -> bool:
    principal = current_principal.get()
    return bool(principal and principal.has_scope(handlers.SENSITIVE_SCOPE))


def write_error(exc: BaseException) -> DomainError:
    """The structured error of one write of a batch (what the interceptor does for a whole call)."""
    if isinstance(exc, DomainError):
        return exc
    if isinstance(exc, asyncpg.PostgresError) and (exc.sqlstate or "")[:2] in ("22", "54"):
        return ValidationFailed("the write holds a value the store cannot keep", field="content",
                                hint="shorten or correct the values you sent; see the limits in the README")
    log.error("write in a batch failed", exc_info=exc)
    return Internal(f"internal error ({type(exc).__name__}); see the service log", retryable=True,
                    hint="retry this write once; if it persists, report it")


def _detail(error: DomainError) -> common_pb2.ErrorDetail:
    return common_pb2.ErrorDetail(error_type=error.error_type, field=error.field, reason=error.reason,
                                  retryable=error.retryable, hint=error.hint)


def _batch_result(i: int, outcome: WriteResult | BaseException) -> memory_pb2.WriteBatchResult:
    if isinstance(outcome, WriteResult):
        return memory_pb2.WriteBatchResult(result=result_to_proto(outcome))
    detail = _detail(write_error(outcome))
    detail.field = f"writes[{i}].{detail.field}" if detail.field else f"writes[{i}]"
    failed = memory_pb2.WriteMemoryResponse(status=memory_pb2.WRITE_STATUS_FAILED)
    return memory_pb2.WriteBatchResult(result=failed, error=detail)


def _batch_tenant(request: memory_pb2.WriteBatchRequest, refused: dict[int, DomainError]) -> str:
    """The tenant of the call: the token's (the pipeline set it), else the first the writes name."""
    named = (w.tenant.tenant_id for i, w in enumerate(request.writes) if i not in refused)
    tenant = request.tenant.tenant_id or next((t for t in named if t), "")
    if not tenant:
        raise ValidationFailed("is required", field="tenant.tenant_id",
                               hint="say which tenant the writes are for")
    return tenant


def _foreign(named: str, tenant: str) -> PermissionDenied:
    return PermissionDenied(f"is {quote(named)}, but this WriteBatch is for tenant {tenant!r}",
                            field="tenant.tenant_id",
                            hint="leave it empty, or send that tenant's writes in a call of their own, with "
                                 "a token for that tenant")


def _at_edge(request: memory_pb2.WriteBatchRequest) -> tuple[str, dict[int, DomainError]]:
    """The call's tenant, and the writes the edge refuses, each alone (the pipeline would refuse a whole
    Write for them): a field breaking its limit, or a tenant other than the call's (the token decides; a
    write can only agree)."""
    checked = enumerate(check_items(request.writes))
    refused: dict[int, DomainError] = {i: error for i, error in checked if error is not None}
    tenant = _batch_tenant(request, refused)
    for i, write in enumerate(request.writes):
        named = write.tenant.tenant_id
        if i not in refused and named and named != tenant:
            refused[i] = _foreign(named, tenant)
    return tenant, refused


class MemoryWriterServicer(memory_pb2_grpc.MemoryWriterServicer):
    def __init__(self, uow: UnitOfWorkFactory, summarizer: Summarizer | None = None,
                 triggers: Triggers = DEFAULT_TRIGGERS, policy: WritePolicy = DEFAULT_POLICY,
                 copies: StreamCopies | None = None) -> None:
        self.uow, self.summarizer, self.triggers, self.policy = uow, summarizer, triggers, policy
        self.copies = copies

    async def Write(self, request, context):
        result = await handlers.write_memory(command_from_proto(request, _caller()), self.uow(),
                                             policy=self.policy)
        return result_to_proto(result)

    async def WriteBatch(self, request, context):
        if not request.writes:
            raise ValidationFailed("is empty", field="writes", hint="send 1 to 500 writes")
        tenant, refused = _at_edge(request)
        outcomes: dict[int, WriteResult | BaseException] = dict(refused)
        accepted = [i for i in range(len(request.writes)) if i not in outcomes]
        if accepted:
            caller = _caller()
            cmds = [command_from_proto(request.writes[i], caller) for i in accepted]
            done = await handlers.write_batch(cmds, self.uow, tenant_id=tenant, policy=self.policy)
            outcomes.update(zip(accepted, done, strict=True))
        return memory_pb2.WriteBatchResponse(results=[_batch_result(i, outcomes[i])
                                                      for i in range(len(request.writes))])

    async def Get(self, request, context):
        cmd = handlers.GetMemory(request.tenant.tenant_id, request.memory_id, reveal=_may_see_sensitive())
        record, revealed = await handlers.get_memory(cmd, self.uow())
        return memory_pb2.GetMemoryResponse(memory=memory_to_proto(record, revealed=revealed))

    async def Forget(self, request, context):
        principal = current_principal.get()
        cmd = handlers.ForgetMemory(request.tenant.tenant_id, request.tenant.user_id, request.memory_id,
                                    requested_by=principal.subject if principal else "",
                                    admin=bool(principal and principal.has_scope(handlers.ADMIN_SCOPE)))
        return memory_pb2.ForgetResponse(forgotten=await handlers.forget(cmd, self.uow(), self.copies))

    async def ForgetTenant(self, request, context):
        cmd = handlers.ForgetTenant(request.tenant.tenant_id, request.confirm_tenant_id)
        done = await handlers.forget_tenant(cmd, self.uow(), self.copies)
        return memory_pb2.ForgetTenantResponse(forgotten=done.memories, users=done.users)

    async def RotateTenantKey(self, request, context):
        version, rewrapped = await handlers.rotate_tenant_key(handlers.RotateTenantKey(request.tenant.tenant_id),
                                                              self.uow())
        return memory_pb2.RotateTenantKeyResponse(version=version, rewrapped=rewrapped)

    async def Correct(self, request, context):
        cmd = handlers.CorrectEntity(
            tenant_id=request.tenant.tenant_id, user_id=request.tenant.user_id, session_id=request.tenant.session_id,
            key=request.key, content=request.content, reason=request.reason,
            source=request.source or handlers.CorrectEntity.source, layer=request.layer or handlers.CorrectEntity.layer,
            idempotency_key=request.idempotency_key, requested_by=_caller())
        result = await handlers.correct(cmd, self.uow(), policy=self.policy)
        return memory_pb2.CorrectResponse(memory_id=result.memory_id, supersedes=result.supersedes,
                                          duplicate=result.duplicate)

    async def Confirm(self, request, context):
        cmd = handlers.ConfirmMemory(request.tenant.tenant_id, request.memory_id, request.reason, _caller())
        record, supersedes = await handlers.confirm(cmd, self.uow())
        return memory_pb2.ConfirmResponse(memory=memory_to_proto(record), supersedes=supersedes)

    async def History(self, request, context):
        cmd = handlers.KeyHistory(request.tenant.tenant_id, request.tenant.user_id or _caller(), request.key)
        uow = self.uow()
        records = await handlers.history(cmd, uow)
        if _may_see_sensitive():
            async with self.uow() as reader:
                shown = await handlers.revealed(records, reader)
        else:
            shown = [(r, False) for r in records]
        entries = [memory_pb2.HistoryEntry(memory=memory_to_proto(r, revealed=rev), superseded_by=r.superseded_by,
                                           changed_at=timestamp(r.changed_at), changed_by=r.written_by, reason=r.reason)
                   for r, rev in shown]
        return memory_pb2.HistoryResponse(entries=entries)

    async def RegisterEntitySchema(self, request, context):
        cmd = handlers.RegisterEntitySchema(request.tenant.tenant_id, request.key,
                                            json_format.MessageToDict(request.schema))
        await handlers.register_entity_schema(cmd, self.uow())
        return memory_pb2.RegisterEntitySchemaResponse()

    async def SetTenantPolicy(self, request, context):
        cmd = handlers.SetTenantPolicy(request.tenant.tenant_id, _CONTACTS_RULE[request.contacts], _caller())
        await handlers.set_tenant_policy(cmd, self.uow())
        return self._policy(request.tenant.tenant_id, cmd.contacts_sensitive)

    async def GetTenantPolicy(self, request, context):
        tenant_id = request.tenant.tenant_id
        return self._policy(tenant_id, await handlers.tenant_contacts_policy(tenant_id, self.uow()))

    def _policy(self, tenant_id: str, contacts: bool | None) -> memory_pb2.TenantPolicyResponse:
        rule = next(k for k, v in _CONTACTS_RULE.items() if v is contacts)
        return memory_pb2.TenantPolicyResponse(
            contacts=rule, contacts_sensitive=self.policy.for_tenant(tenant_id, contacts).contacts_sensitive(tenant_id))

    async def ListQuarantine(self, request, context):
        cmd = handlers.ListQuarantine(request.tenant.tenant_id, request.tenant.user_id, request.limit)
        records = await handlers.list_quarantine(cmd, self.uow())
        if _may_see_sensitive():
            async with self.uow() as reader:
                shown = await handlers.revealed(records, reader)
        else:
            shown = [(r, False) for r in records]
        return memory_pb2.ListQuarantineResponse(memories=[
            memory_pb2.QuarantinedMemory(memory=memory_to_proto(r, revealed=rev), reasons=list(r.quarantine_reasons))
            for r, rev in shown])

    async def Release(self, request, context):
        cmd = handlers.ReleaseQuarantined(request.tenant.tenant_id, request.memory_id, request.reason, _caller())
        return memory_pb2.ReleaseResponse(result=result_to_proto(await handlers.release(cmd, self.uow())))

    async def Drop(self, request, context):
        cmd = handlers.DropQuarantined(request.tenant.tenant_id, request.memory_id, request.reason)
        return memory_pb2.DropQuarantinedResponse(dropped=await handlers.drop(cmd, self.uow()))

    async def CompressSession(self, request, context):
        triggers = replace(self.triggers, window_tokens=request.window_tokens or self.triggers.window_tokens)
        cmd = CompressSession(request.tenant.tenant_id, request.tenant.user_id or _caller(),
                              request.tenant.session_id, request.strategy or "extractive", request.force, triggers)
        done = await compress_session(cmd, self.uow(), self.summarizer, policy=self.policy)
        return memory_pb2.CompressSessionResponse(
            compressed=bool(done.summary_memory_id), trigger=done.trigger, summary_memory_id=done.summary_memory_id,
            covered=list(done.covered), tokens_before=done.tokens_before, tokens_after=done.tokens_after)


def registration(uow: UnitOfWorkFactory, summarizer: Summarizer | None = None,
                 triggers: Triggers = DEFAULT_TRIGGERS, policy: WritePolicy = DEFAULT_POLICY,
                 copies: StreamCopies | None = None) -> Registration:
    return Registration(memory_pb2_grpc.add_MemoryWriterServicer_to_server,
                        MemoryWriterServicer(uow, summarizer, triggers, policy, copies), "mnemesh.v1.MemoryWriter",
                        SCOPES)
