"""`mnemesh memory write|get|history|correct|confirm|forget|forget-tenant|rotate-key|quarantine|release|drop|`
`compress|policy` (and search).

Each verb calls the running memory-writer over gRPC; `--json` prints the reply as proto3 JSON (one
object) for scripts, otherwise a line or two for people. Errors print the structured ErrorDetail.
An argument no request can carry (bytes that are not UTF-8, a malformed tenant, a count out of range)
is refused by argparse, naming it, with exit code 2, before anything is sent.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import grpc
from google.protobuf import json_format

from libs.config import Settings
from libs.protogen.mnemesh.v1 import common_pb2, memory_pb2, memory_pb2_grpc
from libs.validation import TENANT_ID_RULE, is_tenant_id, quote

__all__ = ["OneLineErrors", "add_memory_commands", "count_arg", "tenant_arg", "text_arg"]

LAYERS = {name.removeprefix("MEMORY_LAYER_").lower(): value
          for name, value in common_pb2.MemoryLayer.items() if value}
SOURCES = {name.removeprefix("SOURCE_KIND_").lower(): value
           for name, value in common_pb2.SourceKind.items() if value}
_STATUS = {v: n.removeprefix("WRITE_STATUS_").lower() for n, v in memory_pb2.WriteStatus.items()}
_MEMORY_STATUS = {v: n.removeprefix("MEMORY_STATUS_").lower() for n, v in common_pb2.MemoryStatus.items()}
CONTACTS = {"default": memory_pb2.CONTACTS_POLICY_UNSPECIFIED, "sensitive": memory_pb2.CONTACTS_POLICY_SENSITIVE,
            "plain": memory_pb2.CONTACTS_POLICY_PLAIN}


class OneLineErrors(argparse.ArgumentParser):
    """A verb's parser whose usage errors are one line: the argument, what is wrong, what to do."""

    def error(self, message: str):  # argparse's own: the usage, then the message
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def text_arg(value: str) -> str:
    """An argument that becomes text in a request. Bytes of argv that are not UTF-8 reach Python as lone
    surrogates (surrogateescape), which no protobuf string can hold."""
    bad = next((i for i, c in enumerate(value) if "\ud800" <= c <= "\udfff"), None)
    if bad is None:
        return value
    char = value[bad]
    what = f"the byte 0x{ord(char) - 0xDC00:02x}" if "\udc80" <= char <= "\udcff" else f"U+{ord(char):04X}"
    raise argparse.ArgumentTypeError(f"is not valid UTF-8 ({what} at position {bad}); pass the text UTF-8 "
                                     "encoded (check the terminal's or the script's encoding)")


def tenant_arg(value: str) -> str:
    """The tenant a development token is minted for: one a token can hold."""
    if not is_tenant_id(value):
        raise argparse.ArgumentTypeError(f"is {quote(value)}; a tenant id is {TENANT_ID_RULE} (e.g. acme)")
    return value


def count_arg(most: int, zero_means: int) -> Callable[[str], int]:
    """A count from 0 (meaning `zero_means`) to `most`, as the request's field takes it."""
    def count(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"is {quote(value)}, not a whole number; give 0 (means "
                                             f"{zero_means}) to {most}") from None
        if not 0 <= number <= most:
            raise argparse.ArgumentTypeError(f"is {number}; give 0 (means {zero_means}) to {most}")
        return number

    return count


def _show(ns: argparse.Namespace, reply, text: str) -> None:
    print(json_format.MessageToJson(reply, indent=None, ensure_ascii=False) if ns.json else text)


def _tenant(ns: argparse.Namespace, **extra) -> common_pb2.TenantContext:
    return common_pb2.TenantContext(user_id=getattr(ns, "for_user", "") or ns.user, **extra)


def _memory_line(m: common_pb2.Memory) -> str:
    confirm = "  (confirm before use)" if m.must_confirm else ""
    return (f"{m.memory_id}  [{_MEMORY_STATUS.get(m.status, '?')}, L{m.confidence}]  "
            f"{m.key + ' = ' if m.key else ''}{m.content}{confirm}")


def _verbs(stub: Callable[[grpc.aio.Channel], memory_pb2_grpc.MemoryWriterStub]):
    async def write(ch, ns):
        reply = await stub(ch).Write(memory_pb2.WriteMemoryRequest(
            tenant=_tenant(ns, session_id=ns.session), layer=LAYERS[ns.layer], source=SOURCES[ns.source],
            content=ns.content, key=ns.key, tags=ns.tag or [], step_id=ns.step_id,
            idempotency_key=ns.idempotency_key), timeout=10)
        notes = [_STATUS.get(reply.status, "")] + (["confirm before use"] if reply.must_confirm else []) + (
            [f"supersedes {reply.supersedes}"] if reply.supersedes else []) + list(reply.quarantine_reasons)
        _show(ns, reply, f"{reply.memory_id}  ({', '.join(n for n in notes if n)})")

    async def get(ch, ns):
        reply = await stub(ch).Get(memory_pb2.GetMemoryRequest(memory_id=ns.memory_id), timeout=10)
        _show(ns, reply, _memory_line(reply.memory))

    async def history(ch, ns):
        reply = await stub(ch).History(memory_pb2.HistoryRequest(tenant=_tenant(ns), key=ns.key), timeout=10)
        lines = [f"{e.memory.created_at.ToJsonString()}  {_memory_line(e.memory)}"
                 + (f"  -> {e.superseded_by}" if e.superseded_by else "")
                 + (f"  by {e.changed_by}" if e.changed_by else "") + (f"  ({e.reason})" if e.reason else "")
                 for e in reply.entries]
        _show(ns, reply, "\n".join(lines) or f"no values for {ns.key}")

    async def correct(ch, ns):
        reply = await stub(ch).Correct(memory_pb2.CorrectRequest(
            tenant=_tenant(ns), key=ns.key, content=ns.content, reason=ns.reason,
            idempotency_key=ns.idempotency_key), timeout=10)
        _show(ns, reply, f"{reply.memory_id}" + (f"  (supersedes {reply.supersedes})" if reply.supersedes else ""))

    async def confirm(ch, ns):
        reply = await stub(ch).Confirm(memory_pb2.ConfirmRequest(memory_id=ns.memory_id, reason=ns.reason),
                                       timeout=10)
        _show(ns, reply, _memory_line(reply.memory))

    async def forget(ch, ns):
        reply = await stub(ch).Forget(memory_pb2.ForgetRequest(
            tenant=common_pb2.TenantContext(user_id=ns.for_user), memory_id=ns.memory_id or ""), timeout=10)
        _show(ns, reply, f"forgot {reply.forgotten} memories")

    async def forget_tenant(ch, ns):
        reply = await stub(ch).ForgetTenant(memory_pb2.ForgetTenantRequest(confirm_tenant_id=ns.confirm), timeout=120)
        _show(ns, reply, f"forgot the tenant: {reply.forgotten} memories; {reply.users} user keys destroyed")

    async def rotate_key(ch, ns):
        reply = await stub(ch).RotateTenantKey(memory_pb2.RotateTenantKeyRequest(), timeout=120)
        _show(ns, reply, f"tenant key version {reply.version}; {reply.rewrapped} user keys re-wrapped")

    async def quarantine(ch, ns):
        reply = await stub(ch).ListQuarantine(memory_pb2.ListQuarantineRequest(
            tenant=common_pb2.TenantContext(user_id=ns.for_user), limit=ns.limit), timeout=10)
        lines = [f"{q.memory.memory_id}  {', '.join(q.reasons)}  {q.memory.content[:120]}" for q in reply.memories]
        _show(ns, reply, "\n".join(lines) or "the quarantine is empty")

    async def release(ch, ns):
        reply = await stub(ch).Release(memory_pb2.ReleaseRequest(memory_id=ns.memory_id, reason=ns.reason),
                                       timeout=10)
        _show(ns, reply, f"{reply.result.memory_id}  ({_STATUS.get(reply.result.status, '')})")

    async def drop(ch, ns):
        reply = await stub(ch).Drop(memory_pb2.DropQuarantinedRequest(memory_id=ns.memory_id, reason=ns.reason), timeout=10)
        _show(ns, reply, "dropped" if reply.dropped else "not dropped")

    async def compress(ch, ns):
        reply = await stub(ch).CompressSession(memory_pb2.CompressSessionRequest(
            tenant=_tenant(ns, session_id=ns.session_id), strategy=ns.strategy, force=ns.force), timeout=30)
        _show(ns, reply, (f"{reply.summary_memory_id}: {len(reply.covered)} turns ({reply.trigger}), "
                          f"{reply.tokens_before} -> {reply.tokens_after} tokens") if reply.compressed
              else "nothing to compress")

    async def policy(ch, ns):
        if ns.contacts is None:
            reply = await stub(ch).GetTenantPolicy(memory_pb2.GetTenantPolicyRequest(), timeout=10)
        else:
            reply = await stub(ch).SetTenantPolicy(memory_pb2.SetTenantPolicyRequest(contacts=CONTACTS[ns.contacts]),
                                                   timeout=10)
        if ns.json:  # every field, defaults too: "plain" and "no rule of its own" are answers here
            print(json_format.MessageToJson(reply, indent=None, always_print_fields_with_no_presence=True))
            return
        whose = "the tenant rule" if reply.contacts else "the deployment default"
        print(f"contacts: {'sensitive' if reply.contacts_sensitive else 'plain'} ({whose})")

    return {f.__name__.replace("_", "-"): f for f in (write, get, history, correct, confirm, forget, forget_tenant,
                                                       rotate_key, quarantine, release, drop, compress, policy)}


def add_memory_commands(memory: argparse._SubParsersAction, run: Callable[..., int],
                        settings_of: Callable[[], Settings], identity: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add the memory-writer's verbs under `mnemesh memory`; `run(settings, ns, service, call)` runs one call."""
    verbs = _verbs(memory_pb2_grpc.MemoryWriterStub)

    def verb(name: str, help_text: str) -> argparse.ArgumentParser:
        p = memory.add_parser(name, help=help_text)
        p.add_argument("--json", action="store_true", help="print the reply as JSON")
        identity(p)
        call = verbs[name]
        p.set_defaults(func=lambda ns: run(settings_of(), ns, "memory-writer", lambda ch: call(ch, ns)))
        return p

    p = verb("write", "write one memory; prints its id and what happened")
    p.add_argument("content", type=text_arg)
    p.add_argument("--layer", choices=list(LAYERS), default="long_term")
    p.add_argument("--source", choices=list(SOURCES), default="user_statement")
    p.add_argument("--session", default="", type=text_arg)
    p.add_argument("--key", default="", type=text_arg, help="entity key, e.g. user.phone (entity layer)")
    p.add_argument("--step-id", default="", type=text_arg, help="the step id (step layer)")
    p.add_argument("--tag", action="append", type=text_arg)
    p.add_argument("--idempotency-key", default="", type=text_arg)
    verb("get", "one memory (sensitive values redacted without memory:sensitive)").add_argument("memory_id",
                                                                                                type=text_arg)
    verb("history", "every value an entity key has had").add_argument("key", type=text_arg)
    p = verb("correct", "a new L1 value for an entity key (supersedes the current one)")
    p.add_argument("key", type=text_arg)
    p.add_argument("content", type=text_arg)
    p.add_argument("--reason", default="", type=text_arg)
    p.add_argument("--idempotency-key", default="", type=text_arg)
    p = verb("confirm", "the user confirmed a memory: it becomes L1")
    p.add_argument("memory_id", type=text_arg)
    p.add_argument("--reason", default="", type=text_arg)
    p = verb("forget", "forget one memory, or every memory of a user")
    p.add_argument("memory_id", nargs="?", type=text_arg)
    p.add_argument("--for-user", default="", type=text_arg, help="whose memories (yours when empty)")
    p = verb("forget-tenant", "forget the whole tenant of your token: every memory, rule and key (memory:admin); "
                              "cannot be undone")
    p.add_argument("--confirm", required=True, metavar="TENANT_ID", type=text_arg,
                   help="your token's tenant id, repeated")
    verb("rotate-key", "a new tenant key: every user key re-wrapped, content untouched (memory:admin)")
    p = verb("quarantine", "what the poisoning guard holds (memory:admin)")
    p.add_argument("--for-user", default="", type=text_arg)
    p.add_argument("--limit", type=count_arg(500, zero_means=50), default=50, help="0 (means 50) to 500")
    for name, help_text in (("release", "release a quarantined memory to service"),
                            ("drop", "drop a quarantined memory")):
        p = verb(name, help_text)
        p.add_argument("memory_id", type=text_arg)
        p.add_argument("--reason", default="", type=text_arg)
    p = verb("compress", "compress a session's history into a summary memory")
    p.add_argument("session_id", type=text_arg)
    p.add_argument("--strategy", choices=["extractive", "abstractive", "hybrid"], default="extractive")
    p.add_argument("--force", action="store_true")
    p = verb("policy", "the tenant's write rules: shown, or set with --contacts (memory:admin)")
    p.add_argument("--contacts", choices=list(CONTACTS), help="phone numbers and e-mails: sensitive (sealed, "
                   "redacted), plain, or default (the deployment's MNEMESH_MEMORY_SENSITIVE_CONTACTS)")
