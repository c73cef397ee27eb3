"""`mnemesh chat` and `mnemesh session state|replay` against a real Orchestrator server: two chats on one
session (real processes, stdin driven by the test) print the same events and end at the same version."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator

import anyio
import pytest

from libs.auth import TokenVerifier
from libs.config import load_settings
from libs.db import Database
from libs.eventstore import EventStore
from libs.outbox import Outbox
from libs.rpc import GrpcServer
from mnemesh.infra import free_port
from services.orchestrator.adapters.local import LocalMemory, LocalTools
from services.orchestrator.adapters.repository import EventSourcedSessions
from services.orchestrator.adapters.rules_file import RulesFile
from services.orchestrator.entrypoints import grpc_api
from services.orchestrator.service_layer.agent import Agent

pytestmark = pytest.mark.integration
SECRET = "session-cli-test-secret-0123456789abcdef"


@pytest.fixture
async def env(db: Database) -> AsyncIterator[dict[str, str]]:
    sessions = EventSourcedSessions(db, EventStore(db), Outbox(db))
    memory = LocalMemory()
    port = free_port()
    server = GrpcServer("127.0.0.1", port, [grpc_api.registration(sessions, Agent(
        sessions, RulesFile(), memory, LocalTools(), memory))], TokenVerifier(load_settings(jwt_secret=SECRET)))
    await server.start()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MNEMESH_")}
    yield {**clean, "MNEMESH_JWT_SECRET": SECRET, "MNEMESH_ORCHESTRATOR_GRPC_PORT": str(port)}
    await server.stop(0)


def chat(env: dict[str, str], device: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mnemesh", "chat", "s1", "--device", device], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def read_until(process: subprocess.Popen, needle: str) -> list[str]:
    lines: list[str] = []
    with anyio.fail_after(30):
        while not lines or needle not in lines[-1]:
            line = await anyio.to_thread.run_sync(process.stdout.readline, abandon_on_cancel=True)
            assert line, f"the chat ended before printing {needle!r}: {lines} {process.stderr.read()}"
            lines.append(line.rstrip("\n"))
    return lines


async def finish(process: subprocess.Popen) -> list[str]:
    """End the chat's input; the rest of what it prints, up to its exit."""
    process.stdin.close()
    with anyio.fail_after(30):
        rest = await anyio.to_thread.run_sync(process.stdout.read, abandon_on_cancel=True)
        err = await anyio.to_thread.run_sync(process.stderr.read, abandon_on_cancel=True)
        assert await anyio.to_thread.run_sync(process.wait, abandon_on_cancel=True) == 0, err
    return rest.splitlines()


async def mnemesh(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """Run in a thread: the server answering it runs on this test's event loop."""
    return await anyio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "mnemesh", *args], env=env, capture_output=True, text=True, timeout=60))


async def test_two_chats_on_one_session_print_the_same_events_and_end_at_the_same_version(env) -> None:
    phone, laptop = chat(env, "phone"), chat(env, "laptop")
    try:
        phone.stdin.write("where is my order A12345?\n")
        phone.stdin.flush()
        seen_by_phone = await read_until(phone, "assistant@orchestrator: Order A12345 is shipped")
        seen_by_laptop = await read_until(laptop, "assistant@orchestrator: Order A12345 is shipped")
        laptop.stdin.write("查一下 B77777 的发票\n")
        laptop.stdin.flush()
        seen_by_phone += await read_until(phone, "The invoice for order B77777")
        seen_by_laptop += await read_until(laptop, "The invoice for order B77777")
        seen_by_phone += await finish(phone)
        seen_by_laptop += await finish(laptop)
    finally:
        for process in (phone, laptop):
            if process.poll() is None:
                process.kill()
                process.wait()
            for pipe in (process.stdin, process.stdout, process.stderr):
                pipe.close()
    assert seen_by_phone == seen_by_laptop  # every event, in the same order, then the same final version
    assert seen_by_phone[-1].startswith("-- s1 at version ")
    assert any("user@laptop: 查一下 B77777 的发票" in line for line in seen_by_phone)

    state = await mnemesh(env, "session", "state", "s1", "--last", "1")
    assert state.returncode == 0, state.stderr
    version = seen_by_phone[-1].split()[-1]
    assert state.stdout.startswith(f"s1: version {version}, state IDLE, 4 messages")
    replay = await mnemesh(env, "session", "replay", "s1", "--quiet")
    assert replay.returncode == 0, replay.stderr
    assert f"replayed {version} events: version {version}, state IDLE" in replay.stdout
    assert replay.stdout.rstrip().endswith("same")
