"""A turn whose orchestrator process was killed mid-call is taken over by the next Send once its lease ran out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from libs.db import Database
from libs.eventstore import EventStore
from libs.outbox import Outbox
from services.orchestrator.adapters.local import LocalMemory, LocalTools
from services.orchestrator.adapters.repository import EventSourcedSessions
from services.orchestrator.adapters.rules_file import RulesFile
from services.orchestrator.domain import ActionFinished, Outcome, State, TurnRecovered
from services.orchestrator.service_layer.agent import Agent
from services.orchestrator.service_layer.handlers import SendMessage, replay_session, send_message

pytestmark = pytest.mark.integration
HERE = Path(__file__).parent


async def test_a_turn_left_busy_by_a_killed_process_is_recovered_by_the_next_send(
        db: Database, database_url: str, schema: str, as_owner) -> None:
    process = subprocess.Popen([sys.executable, str(HERE / "turn_process.py"), database_url, schema, "s1"],
                               stdout=subprocess.PIPE, text=True, cwd=HERE.parent.parent,
                               env={**os.environ, "PYTHONPATH": str(HERE.parent.parent)})
    try:
        with anyio.fail_after(30):
            line = await anyio.to_thread.run_sync(process.stdout.readline)
        assert line.startswith("calling "), line
        lost_call = line.split()[1]
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        process.stdout.close()

    sessions = EventSourcedSessions(db, EventStore(db), Outbox(db))
    assert (await sessions.load("acme", "s1")).state == State.ROUTING  # busy, and nobody is running it
    await as_owner("UPDATE events SET occurred_at = occurred_at - interval '61 seconds'")  # the lease runs out
    sessions = EventSourcedSessions(db, EventStore(db), Outbox(db))  # a new process: nothing cached
    tools, memory = LocalTools(), LocalMemory()
    agent = Agent(sessions, RulesFile(), memory, tools, memory, tool_deadline_seconds=10, lease_seconds=60)
    with anyio.fail_after(30):
        session = await send_message(SendMessage("acme", "u1", "s1", "web", "hello?"), sessions, agent)

    history = [v.event for v in await sessions.history("acme", "s1")]
    recovered = [e for e in history if isinstance(e, TurnRecovered)]
    assert len(recovered) == 1 and recovered[0].state == State.ROUTING and recovered[0].idle_seconds > 60
    assert [(e.action_id, e.outcome) for e in history if isinstance(e, ActionFinished)] == [
        (lost_call, Outcome.TIMEOUT), (tools.calls[0][2], Outcome.OK)]
    assert tools.status_checks == [lost_call]
    replies = [m.text for m in session.messages if m.role == "assistant"]
    assert replies[0].startswith("Order A12345 is shipped") and replies[1].startswith("Hello!")
    assert (session.state, session.task) == (State.IDLE, None)
    assert session.to_dict() == (await replay_session("acme", "s1", sessions)).to_dict()
