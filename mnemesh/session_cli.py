"""`mnemesh session send|follow|replay|state` and `mnemesh chat`: a session over gRPC, as a device sees it.

`chat` is a device: it catches up on the session from version 0, follows it live, and sends each
line typed (or piped) on stdin. Two chats on one session print the same events in the same order;
at the end of its input a chat waits until it has seen its own last message's turn, then prints
the version it ends at.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable

import grpc

from libs.config import Settings
from libs.protogen.mnemesh.v1 import common_pb2, sessions_pb2, sessions_pb2_grpc

__all__ = ["add_session_commands", "describe"]

_TURN_SECONDS = 120  # Send answers after the whole turn: tools and a model included


def describe(event: sessions_pb2.SessionEvent) -> str:
    """One line per event: messages and state changes in words, the others as their fields."""
    if event.HasField("message_appended"):
        m = event.message_appended
        return f"{event.version}  {m.role}@{m.device_id}: {m.text}"
    if event.HasField("state_changed"):
        s = event.state_changed
        return f"{event.version}  state {s.from_state} -> {s.to_state} ({s.reason})"
    field = event.event_type.removeprefix("session.")
    body = getattr(event, field, None) if field in event.DESCRIPTOR.fields_by_name else None
    detail = " ".join(f"{k.name}={v}" for k, v in body.ListFields() if k.name != "tenant") if body else ""
    return f"{event.version}  {field} {detail}"


def _send_request(ns: argparse.Namespace, text: str, expected_version: int = -1,
                  idempotency_key: str = "") -> sessions_pb2.SendRequest:
    return sessions_pb2.SendRequest(tenant=common_pb2.TenantContext(user_id=ns.user), session_id=ns.session_id,
                                    device_id=ns.device, text=text, expected_version=expected_version,
                                    idempotency_key=idempotency_key)


async def _send(stub: sessions_pb2_grpc.OrchestratorStub, ns: argparse.Namespace) -> None:
    reply = await stub.Send(_send_request(ns, ns.text, ns.expected_version, ns.idempotency_key),
                            timeout=_TURN_SECONDS)
    print(f"version {reply.version}, state {reply.state}")


async def _follow(stub: sessions_pb2_grpc.OrchestratorStub, ns: argparse.Namespace) -> None:
    async for event in stub.Subscribe(sessions_pb2.SubscribeRequest(session_id=ns.session_id,
                                                                     from_version=ns.from_version)):
        print(describe(event), flush=True)


async def _state(stub: sessions_pb2_grpc.OrchestratorStub, ns: argparse.Namespace) -> None:
    s = await stub.GetSession(sessions_pb2.GetSessionRequest(session_id=ns.session_id), timeout=10)
    print(f"{s.session_id}: version {s.version}, state {s.state}, {len(s.messages)} messages")
    for text in s.messages[-ns.last:] if ns.last else s.messages:
        print(f"  {text}")


async def _replay(stub: sessions_pb2_grpc.OrchestratorStub, ns: argparse.Namespace) -> bool:
    """Every event from version 1 up to the version the service reports, then the state they rebuild
    (here, with the same domain code) against the service's: a replay that differs exits 1."""
    from services.orchestrator.adapters.repository import from_message
    from services.orchestrator.domain import Session, Versioned

    live = await stub.GetSession(sessions_pb2.GetSessionRequest(session_id=ns.session_id), timeout=10)
    items = []
    if live.version:
        async for event in stub.Subscribe(sessions_pb2.SubscribeRequest(session_id=ns.session_id, from_version=0),
                                          timeout=60):
            if not ns.quiet:
                print(describe(event))
            field = event.event_type.removeprefix("session.")
            items.append(Versioned(event.version, from_message(event.event_type, getattr(event, field), ""),
                                   event.occurred_at.ToDatetime()))
            if event.version >= live.version:
                break
    replayed = Session.replay(ns.tenant, ns.session_id, items)
    same = (replayed.version, str(replayed.state), [m.text for m in replayed.messages]) == \
        (live.version, live.state, list(live.messages))
    print(f"replayed {len(items)} events: version {replayed.version}, state {replayed.state}, "
          f"{len(replayed.messages)} messages, task {replayed.task.task_id if replayed.task else 'none'}; "
          f"the service: version {live.version}, state {live.state}: {'same' if same else 'DIFFERENT'}")
    return same


async def _chat(stub: sessions_pb2_grpc.OrchestratorStub, ns: argparse.Namespace) -> None:
    seen, moved = 0, asyncio.Event()

    async def follow() -> None:
        nonlocal seen
        async for event in stub.Subscribe(sessions_pb2.SubscribeRequest(session_id=ns.session_id, from_version=0)):
            print(describe(event), flush=True)
            seen = event.version
            moved.set()

    following = asyncio.create_task(follow())
    if sys.stdin.isatty():
        print(f"chat on {ns.session_id} as {ns.device}: type a message and Enter; Ctrl-D ends", flush=True)
    last = 0
    try:
        while line := await asyncio.to_thread(sys.stdin.readline):
            if text := line.strip():
                reply = await stub.Send(_send_request(ns, text), timeout=_TURN_SECONDS)
                last = max(last, reply.version)
        # Before leaving, show the session as far as it is now (this device's last turn and what other
        # devices appended meanwhile): two chats that leave at the same moment print the same version.
        current = await stub.GetSession(sessions_pb2.GetSessionRequest(session_id=ns.session_id), timeout=10)
        while seen < max(last, current.version) and not following.done():
            moved.clear()
            await moved.wait()
        if following.done():
            following.result()  # the stream failed: raise its error
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
    print(f"-- {ns.session_id} at version {seen}", flush=True)


def add_session_commands(sub: argparse._SubParsersAction, settings_of: Callable[[], Settings], run,
                         identity) -> None:
    def rpc(call, *, check: bool = False):
        def handler(ns: argparse.Namespace) -> int:
            outcome = []

            async def go(ch: grpc.aio.Channel) -> None:
                outcome.append(await call(sessions_pb2_grpc.OrchestratorStub(ch), ns))

            code = run(settings_of(), ns, "orchestrator", go)
            return 1 if code == 0 and check and outcome and not outcome[0] else code

        return handler

    session = sub.add_parser("session", help="talk to a session").add_subparsers(dest="verb", required=True)
    p = session.add_parser("send", help="append a user message (answers after the turn it starts)")
    p.add_argument("session_id")
    p.add_argument("text")
    p.add_argument("--device", default="cli")
    p.add_argument("--expected-version", type=int, default=-1, help="the version this device saw (-1: any)")
    p.add_argument("--idempotency-key", default="")
    identity(p)
    p.set_defaults(func=rpc(_send))
    p = session.add_parser("follow", help="print a session's events from a version on, then live (Ctrl-C ends)")
    p.add_argument("session_id")
    p.add_argument("--from-version", type=int, default=0)
    identity(p)
    p.set_defaults(func=rpc(_follow))
    p = session.add_parser("state", help="a session's current version, state and messages")
    p.add_argument("session_id")
    p.add_argument("--last", type=int, default=0, help="only the last N messages")
    identity(p)
    p.set_defaults(func=rpc(_state))
    p = session.add_parser("replay", help="every event of a session, and the state they rebuild compared with "
                                          "the service's (exit 1 when they differ)")
    p.add_argument("session_id")
    p.add_argument("--quiet", action="store_true", help="only the comparison, not each event")
    identity(p)
    p.set_defaults(func=rpc(_replay, check=True))

    p = sub.add_parser("chat", help="an interactive device on a session: follows it and sends what you type")
    p.add_argument("session_id")
    p.add_argument("--device", default="cli")
    identity(p)
    p.set_defaults(func=rpc(_chat))
